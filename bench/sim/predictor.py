"""`specroute sim predictor`: how much of the request oracle's gain over the best static fleet the
per-request acceptance predictor captures, replayed offline on `bench routing`'s per-request traces.

Pure (traffic, prompt texts, profile in; numbers out), cheap (one pass per arm, no event loop):

- Each request of a traffic group (one scenario round of `bench routing`) has a replay per mode (MTP,
  DFly + D-Cut, AR): the steps that mode took for it, its drafts and accepted drafts. Its time on a
  mode is priced from the step-cost profile as `bench routing`'s fleets of two workers run it: prefill,
  then its drafted steps at one drafter call + one verify of its width (D-Cut: padded as measured, plus
  D-Cut's own work) and its plain steps at a one-token verify, for `concurrency / 2` rows a worker.
  As in bench/routing_ceiling.py, a request keeps that time whatever shares its batch (additive).
- Arms: each single-mode fleet; `learned`: the gateway's own `decide` over three pools (mtp, dfly, ar)
  with the statistics its feedback builds as the group goes (warm-up requests first, unmeasured);
  `predicted`: the same with the acceptance predictor as the prior; the request oracle sends each
  request to its fastest mode (a ceiling, not an arm).
- No leakage: prompts are split in two folds by a hash of their text; each request is decided with the
  predictor fitted on the other fold's feedback records (every mode's record of each of its requests,
  every scenario and round), so no prediction comes from a model that saw the prompt.
- Figures per scenario over its rounds: each arm's gain over the best single-mode fleet, the share of
  the request oracle's gain `predicted` captures, and paired regret (round by round, against the arm
  with the most tokens/s over the rounds); and the predictor's held-out error against the per-context
  mean it refines.

The traffic (`specroute sim traffic`) keeps no prompt text; `texts_of` regenerates `bench routing`'s
traces (same data, seed and sizes: bench/routing_trace.py) and checks each request's context buckets
against its text.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.routing_metrics import paired_regret
from bench.sim.core import Request, StepProfile
from bench.sim.gateway_policy import (
    GLOBAL_LEVEL,
    CellStats,
    FeedbackRecord,
    Policy,
    PoolState,
    Predictor,
    RequestContext,
    Sample,
    decide,
    default_policy,
    fit,
    learn,
    level_keys,
    level_mean,
    predict,
    prompt_features,
    request_features,
)

MODES = ("mtp", "dfly", "ar")
FLEETS = {"all-mtp": "mtp", "all-dfly": "dfly", "all-ar": "ar"}
ROUTED = ("learned", "predicted", "perfect-prior")


@dataclass(frozen=True)
class Item:
    """One request with what the predictor reads: its prompt features and its fold."""

    req: Request
    prompt: tuple[float, ...]
    fold: int


def fold_of(text: str, folds: int = 2) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % folds


def texts_of(groups: Mapping[str, Sequence[Request]], data_dir: Path, seed: int, requests_per_scenario: int,
             warmup: int, concurrency: int) -> tuple[dict[str, list[str]], dict[str, int]]:
    """group -> each request's prompt text (a warm-up copy `-1 - i` is measured request i), from the
    regenerated traces of `bench routing`; and per scenario the requests whose context buckets do not
    match their text (0 when the traces are the run's)."""
    from bench.routing_trace import SCENARIOS, PromptPool, build_trace, read_prompts
    from specroute.contracts.context import request_context
    from specroute.contracts.limits import text_bytes

    prompts = read_prompts(data_dir)
    traces: dict[str, list[str]] = {}
    for name, sc in SCENARIOS.items():
        pool = PromptPool(prompts, seed)
        if warmup:
            build_trace(sc, warmup, concurrency, pool, seed, phase=0)   # the run drew its warm-up first
        traces[name] = [it.text for it in build_trace(sc, max(2, round(requests_per_scenario * sc.requests_factor)),
                                                      concurrency, pool, seed)]
    out: dict[str, list[str]] = {}
    mismatched: dict[str, int] = {}
    for g, reqs in groups.items():
        scen = g.split("/")[0]
        tr = traces[scen]
        texts = [tr[r.index] if r.index >= 0 else tr[-1 - r.index] for r in reqs]
        bad = 0
        for r, t in zip(reqs, texts, strict=True):
            c = request_context([t], r.temperature, text_bytes([t]))
            if r.context is not None and (c.script, c.length) != (r.context.script, r.context.length):
                bad += 1
        mismatched[scen] = mismatched.get(scen, 0) + bad
        out[g] = texts
    return out, mismatched


def items_of(groups: Mapping[str, Sequence[Request]], texts: Mapping[str, Sequence[str]],
             folds: int = 2) -> dict[str, list[Item]]:
    return {g: [Item(r, prompt_features([t], r.temperature), fold_of(t, folds)) for r, t in zip(reqs, texts[g], strict=True)]
            for g, reqs in groups.items()}


# ------------------------------------------------------------------------------------------------
# pricing


def request_ms(req: Request, mode: str, profile: StepProfile) -> float:
    """The request's time on `mode` in a two-worker fleet of that mode at its concurrency (module docstring)."""
    rep = req.replay[mode]
    if rep.tokens == 0:
        return 0.0
    rows = max(1, req.concurrency // 2)
    plain = rep.steps - rep.drafted_steps
    t = profile.prefill_ms(req.prompt_tokens) + plain * profile.verify_ms(rows, 1.0)
    if rep.drafted_steps:
        width, extra = rep.width, 0.0
        if mode == "dfly":
            width = 1.0 + (width - 1.0) * profile.dcut_padding(rows)
            extra = profile.dcut_ms(rows)
        t += rep.drafted_steps * (profile.draft_ms(mode, rows) + profile.verify_ms(rows, width) + extra)
    return t


# ------------------------------------------------------------------------------------------------
# the routed arms


def features_of(it: Item) -> tuple[float, ...]:
    return request_features(it.prompt, it.req.probabilities, it.req.uncertainty)


def domain_of(req: Request) -> str:
    return max(req.probabilities, key=lambda d: req.probabilities[d]) if req.probabilities else "unknown"


def context_of(req: Request, domain: str) -> RequestContext | None:
    c = req.context
    return None if c is None else RequestContext(domain, c.script, c.temperature, c.length)


def samples(items: Sequence[Item], fold: int | None = None) -> list[Sample]:
    """Every speculative mode's feedback record of each request (of `fold`, or all) as the fit reads it."""
    out: list[Sample] = []
    for it in items:
        if fold is not None and it.fold != fold:
            continue
        r = it.req
        feats = features_of(it)
        d = domain_of(r)
        levels = level_keys(d, context_of(r, d))
        for m in MODES:
            rep = r.replay.get(m)
            if m != "ar" and rep is not None and rep.drafted > 0:
                out.append(Sample(m, feats, rep.drafted, rep.accepted, levels))
    return out


def routed(items: Sequence[Item], times: Sequence[Mapping[str, float]], policy: Policy,
           predictor_of: Callable[[Item], Predictor | None], seed: int) -> list[str]:
    """The mode `decide` sends each request to, feedback learned as requests finish (in order; the
    clock advances by each request's time over the concurrency: a closed loop's throughput)."""
    rng = random.Random(seed)
    stats: dict[tuple[str, str], CellStats] = {}
    states = {m: PoolState(healthy=True, max_running=32, endpoints=2, speculative=m != "ar") for m in MODES}
    now = 1.0
    out: list[str] = []
    for it, t in zip(items, times, strict=True):
        r = it.req
        d = decide(r.probabilities, r.uncertainty, stats, states, policy, rng, r.context, it.prompt, predictor_of(it))
        mode = d.pool if d.pool in r.replay else "ar"
        out.append(mode)
        rep = r.replay[mode]
        ms = t[mode]
        if rep.tokens:
            rec = FeedbackRecord(pool=mode, domain=d.domain, tokens=rep.tokens, drafted=rep.drafted,
                                 accepted=rep.accepted, steps=rep.steps, wall_ms=ms, ttft_ms=0.0,
                                 context=d.context.key, features=d.features)
            now += ms / 1000.0 / max(1, r.concurrency)
            learn(stats, rec, now, policy.half_life_s)
    return out


def perfect(it: Item, trained: Predictor) -> Predictor:
    """A predictor that knows the request's own acceptance on each mode (the diagnostic `perfect-prior`
    arm: what the decision makes of a prior that is never wrong), with the trained one's level rates."""
    d = domain_of(it.req)
    levels = level_keys(d, context_of(it.req, d))
    pools = {}
    for m, model in trained.pools.items():
        rep = it.req.replay.get(m)
        base = level_mean(model, (*levels, GLOBAL_LEVEL))
        if rep is not None and rep.drafted > 0 and base is not None:
            pools[m] = model.model_copy(update={"bias": rep.accepted / rep.drafted - base,
                                                "weights": [0.0] * len(model.weights)})
    return trained.model_copy(update={"pools": pools})


# ------------------------------------------------------------------------------------------------
# the evaluation


def held_out_error(items: Sequence[Item], predictors: Mapping[int, Predictor]) -> dict[str, Any]:
    """Per speculative mode, drafted-weighted mean squared error of the held-out acceptance rates: the
    predictor's, and that of its level rates alone (the training fold's acceptance of the request's
    most specific context: what the context buckets know without the features)."""
    out: dict[str, Any] = {}
    for m in ("mtp", "dfly"):
        se_p = se_c = wsum = 0.0
        for fold, pred in predictors.items():
            model = pred.pools.get(m)
            if model is None:
                continue
            for s in samples([it for it in items if it.fold == fold]):
                if s.pool != m:
                    continue
                y = s.accepted / s.drafted
                base = level_mean(model, (*s.levels, "*"))
                se_p += s.drafted * (predict(model, s.features, s.levels) - y) ** 2
                se_c += s.drafted * ((base if base is not None else 0.5) - y) ** 2
                wsum += s.drafted
        if wsum:
            out[m] = {"mse_predictor": round(se_p / wsum, 5), "mse_context_rate": round(se_c / wsum, 5),
                      "r2_vs_context_rate": round(1.0 - se_p / se_c, 4) if se_c > 0 else None}
    return out


def lean_policy(policy: Policy) -> Policy:
    """`policy` as one might run it with a predictor: 1% exploration, no switch margin, UCB."""
    return policy.model_copy(update={"exploration_rate": 0.01, "learning": policy.learning.model_copy(
        update={"switch_margin": 0.0, "method": "ucb"})})


POLICIES: dict[str, Callable[[Policy], Policy]] = {"default": lambda p: p, "lean": lean_policy}


def evaluate(items_by_group: Mapping[str, Sequence[Item]], profile: StepProfile, *, seed: int = 0,
             ridge: float = 30.0, prior_weight: float = 30.0, folds: int = 2, policy: Policy | None = None
             ) -> dict[str, Any]:
    """Cross-fitted predictors, then per scenario: arms' times, gains, capture and paired regret
    (`policy`: the routed arms' policy over mtp, dfly and ar; the built-in default when None)."""
    every = [it for its in items_by_group.values() for it in its]
    predictors = {f: fit(samples([it for it in every if it.fold != f]), ridge=ridge, prior_weight=prior_weight)
                  for f in range(folds)}
    policy = policy or default_policy(list(MODES))
    by_scen: dict[str, dict[str, list[tuple[float, float]]]] = {}   # scenario -> arm -> [(tokens, ms) per round]
    shares: dict[str, dict[str, dict[str, float]]] = {}
    for g, its in items_by_group.items():
        scen = g.split("/")[0]
        times = [{m: request_ms(it.req, m, profile) for m in MODES} for it in its]
        choice: dict[str, list[str]] = {a: [m] * len(its) for a, m in FLEETS.items()}
        choice["request-oracle"] = [min(MODES, key=lambda m: (t[m], m)) for t in times]
        choice["learned"] = routed(its, times, policy, lambda _it: None, seed)
        choice["predicted"] = routed(its, times, policy, lambda it: predictors[it.fold], seed)
        choice["perfect-prior"] = routed(its, times, policy, lambda it: perfect(it, predictors[it.fold]), seed)
        arms = by_scen.setdefault(scen, {})
        for arm, modes in choice.items():
            tok = ms = 0.0
            for it, t, m in zip(its, times, modes, strict=True):
                if it.req.measured:
                    tok += it.req.replay[m].tokens
                    ms += t[m]
                    if arm in ROUTED:
                        sh = shares.setdefault(scen, {}).setdefault(arm, {})
                        sh[m] = sh.get(m, 0.0) + 1.0
            arms.setdefault(arm, []).append((tok, ms))
    scenarios: dict[str, Any] = {}
    for scen, arms in sorted(by_scen.items()):
        total = {a: (sum(t for t, _ in v), sum(ms for _, ms in v)) for a, v in arms.items()}
        # tokens per second of request time: a closed loop's throughput over its concurrency
        tps = {a: 1000.0 * t / ms if ms > 0 else 0.0 for a, (t, ms) in total.items()}
        best_fleet = max(FLEETS, key=lambda a: tps[a])
        gain = {a: round(tps[a] / tps[best_fleet] - 1.0, 4) for a in tps}
        oracle_gain = gain["request-oracle"]
        rounds = {a: [1000.0 * t / ms if ms > 0 else 0.0 for t, ms in v] for a, v in arms.items() if a != "request-oracle"}
        best_arm = max(rounds, key=lambda a: tps[a])
        paired = paired_regret(rounds, best_arm)
        sh = shares.get(scen, {})
        scenarios[scen] = {
            "rounds": len(arms["learned"]),
            "best_static_fleet": best_fleet,
            "gain_over_best_static": gain,
            "request_oracle_gain": oracle_gain,
            "captured": {a: round(gain[a] / oracle_gain, 4) if oracle_gain > 0 else None for a in ROUTED},
            "best_arm": best_arm,
            "paired_regret_median": paired["median_relative"],
            "pool_shares": {a: {m: round(n / sum(s.values()), 4) for m, n in sorted(s.items())} for a, s in sh.items()},
        }
    return {"scenarios": scenarios, "held_out_error": held_out_error(every, predictors),
            "predictors": {str(f): {"records": p.records, "pools": {m: {"records": pm.records, "bias": round(pm.bias, 4),
                                                                         "levels": len(pm.level_means)}
                                                                     for m, pm in p.pools.items()}}
                           for f, p in predictors.items()},
            "folds": folds, "ridge": ridge, "prior_weight": prior_weight}


def summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Over scenarios: the mean share of the oracle's gain captured and the worst paired regret, per routed arm."""
    sc = doc["scenarios"]
    out: dict[str, Any] = {}
    for a in ROUTED:
        caps = [v["captured"][a] for v in sc.values() if v["captured"][a] is not None]
        regs = [v["paired_regret_median"].get(a, 0.0) for v in sc.values()]
        out[a] = {"captured_mean": round(statistics.fmean(caps), 4) if caps else None,
                  "captured_min": round(min(caps), 4) if caps else None,
                  "paired_regret_max": round(max(regs), 4) if regs else None}
    pred = out["predicted"]
    out["target"] = {"captured_at_least": 0.5, "paired_regret_at_most": 0.03,
                     "met": bool(pred["captured_min"] is not None and pred["captured_min"] >= 0.5
                                 and pred["paired_regret_max"] is not None and pred["paired_regret_max"] <= 0.03)}
    return out



def run_predictor(groups: Mapping[str, Sequence[Request]], profile: StepProfile, run_meta: Mapping[str, Any],
                  data_dir: Path, *, ridge: float = 30.0, prior_weight: float = 30.0, seed: int = 0) -> dict[str, Any]:
    """The whole evaluation of a `bench routing` run's traffic, under each of `POLICIES`."""
    texts, mismatched = texts_of(groups, data_dir, int(run_meta["seed"]), int(run_meta["requests_per_scenario"]),
                                 int(run_meta["warmup_requests"]), int(run_meta["concurrency"][0]))
    items = items_of(groups, texts)
    base = default_policy(list(MODES))
    out: dict[str, Any] = {}
    for name, make in POLICIES.items():
        doc = evaluate(items, profile, seed=seed, ridge=ridge, prior_weight=prior_weight, policy=make(base))
        out[name] = {"summary": summary(doc), **doc}
    return {"meta": {"requests": sum(len(v) for v in groups.values()), "groups": len(groups),
                     "context_mismatches_by_scenario": mismatched},
            "policies": out}
