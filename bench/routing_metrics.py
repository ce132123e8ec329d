"""Metrics of `specroute bench routing` (pure: result rows in, numbers out).

A row is one request as `bench.routing_client.Result.row` writes it: `index` (dispatch order),
`phase`, `domain`, `temperature`, `t_send` / `t_first` / `t_end` (seconds from the cell's start), `ok`,
`completion_tokens`, `pool`, `drafted`, `accepted`, `steps`, `drafter_steps` (verification steps by
the drafter that drafted them, or `plain`) and, at temperature 0, `text`.

- output tokens/s: every completion token over the cell's span (first send to last end);
- mean accepted length: tokens per verification step over the cell, (accepted + steps) / steps;
- routing shares and goodput over time: `bins` equal slices of the span; a request's tokens are
  spread evenly over its streaming time (first token to end), its pool counted at its send time;
- better pool of a traffic class (domain x temperature bucket) in a phase: the single-pool fleet
  (all-MTP, all-DFly: the pools the routed arms choose between) whose requests of that class decoded
  faster (median of completion tokens / streaming time);
- switch: after a change (S3's drift, S4's fault), the affected traffic is the classes whose better
  pool (measured after the change) is not the better pool measured before it (`switch_baseline`; a
  class not seen before the change falls back to the built-in default policy's pool, `DEFAULT_POOLS`:
  chat -> mtp, code and math -> dfly), i.e. the traffic the change asks the router to move; the
  switch point is the first affected request from which a window of `window` affected requests has at
  least 90% on the better pool (0: right away; None: never), counted in affected requests and in all
  requests since the change. A request is on the pool the router labelled it with (`pool`), or, for the
  switch by drafter, on what served most of its steps (`served_by`: on a worker serving both modes a
  row labelled `dfly` may draft with MTP's drafter, or none, step by step; on a single-mode worker the
  two agree unless D-Cut kept most steps plain), against what served most steps of the better fleet's
  requests of its class (`better_servers`: `plain` where that fleet's D-Cut ran the class plain).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from specroute.contracts.context import temperature_bucket
from specroute.pools import fleets, preferred, served

Row = Mapping[str, Any]
FLEET_POOLS = fleets()   # single-kind fleet arm -> its pool (specroute/pools.py)
ROUTED_POOLS = tuple(k.name for k in served())   # what the static and learned arms route between
DEFAULT_POOLS = {d: preferred(d, list(ROUTED_POOLS)) for d in ("chat", "code", "math")}   # default_policy's choice
LEARNED_ARMS = ("learned", "learned-shared", "learned-shared-least")   # the arms whose router learns
ROUTED_ARMS = ("static", *LEARNED_ARMS)         # the arms that route


def default_pools(classes: Iterable[str]) -> dict[str, str]:
    """class -> the pool the built-in default policy (learning off) sends it to."""
    return {c: DEFAULT_POOLS.get(c.split("|")[0], "mtp") for c in classes}


def served_by(r: Row) -> str:
    """What served a request: the drafter kind (or `plain`) behind most of its verification steps (the
    first name in sorted order on a tie); its pool when the worker did not say."""
    by = r.get("drafter_steps") or {}
    return max(sorted(by), key=lambda k: by[k]) if by else str(r["pool"])


def labelled_pool(r: Row) -> str:
    return str(r["pool"])


def pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))]


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 1)


def span(rows: Sequence[Row]) -> float:
    if not rows:
        return 0.0
    return max(r["t_end"] for r in rows) - min(r["t_send"] for r in rows)


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    wall = span(rows)
    tokens = sum(r["completion_tokens"] for r in ok)
    steps = sum(r["steps"] for r in ok)
    shares: dict[str, float] = defaultdict(float)
    by_drafter: dict[str, float] = defaultdict(float)
    for r in ok:
        shares[r["pool"]] += 1.0 / len(ok)
        for k, v in (r.get("drafter_steps") or {}).items():
            by_drafter[k] += v / steps
    return {
        "requests": len(rows), "errors": len(rows) - len(ok), "output_tokens": tokens, "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_ms": _ms(pct([r["t_first"] - r["t_send"] for r in ok if r["t_first"]], 50)),
        "ttft_p99_ms": _ms(pct([r["t_first"] - r["t_send"] for r in ok if r["t_first"]], 99)),
        "e2e_p50_ms": _ms(pct([r["t_end"] - r["t_send"] for r in ok], 50)),
        "e2e_p99_ms": _ms(pct([r["t_end"] - r["t_send"] for r in ok], 99)),
        "mean_accepted_length": round((sum(r["accepted"] for r in ok) + steps) / steps, 3) if steps else None,
        "pool_shares": {p: round(s, 4) for p, s in sorted(shares.items())},
        "step_shares_by_drafter": {k: round(v, 4) for k, v in sorted(by_drafter.items())},
    }


def time_series(rows: Sequence[Row], bins: int) -> dict[str, Any]:
    """Goodput (tokens/s) and routing shares per time slice."""
    ok = [r for r in rows if r["ok"]]
    if not ok:
        return {"t": [], "goodput": [], "shares": {}}
    t0 = min(r["t_send"] for r in rows)
    width = max(span(rows), 1e-9) / bins
    tokens = [0.0] * bins
    counts: dict[str, list[float]] = defaultdict(lambda: [0.0] * bins)
    totals = [0.0] * bins
    for r in ok:
        a, b = (r["t_first"] or r["t_send"]) - t0, r["t_end"] - t0
        n = r["completion_tokens"]
        if b <= a:
            tokens[min(bins - 1, int(b / width))] += n
        else:
            for i in range(max(0, int(a / width)), min(bins, int(b / width) + 1)):
                lo, hi = max(a, i * width), min(b, (i + 1) * width)
                if hi > lo:
                    tokens[i] += n * (hi - lo) / (b - a)
        i = min(bins - 1, int((r["t_send"] - t0) / width))
        counts[r["pool"]][i] += 1
        totals[i] += 1
    shares = {p: [round(c[i] / totals[i], 4) if totals[i] else None for i in range(bins)]
              for p, c in sorted(counts.items())}
    return {"t": [round((i + 0.5) * width, 3) for i in range(bins)],
            "goodput": [round(x / width, 2) for x in tokens], "shares": shares}


def traffic_class(r: Row) -> str:
    return f"{r['domain']}|t={temperature_bucket(float(r['temperature']))}"


def decode_speed(r: Row) -> float | None:
    dt = r["t_end"] - r["t_first"] if r["t_first"] else 0.0
    return r["completion_tokens"] / dt if r["ok"] and dt > 0 and r["completion_tokens"] > 1 else None


def better_pools(fleets: Mapping[str, Sequence[Row]], phase: int) -> dict[str, str]:
    """class -> the faster of the fleets' pools in `phase` (fleet arm name -> its rows)."""
    speeds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for arm, rows in fleets.items():
        pool = FLEET_POOLS.get(arm)
        if pool not in ROUTED_POOLS:
            continue
        for r in rows:
            v = decode_speed(r)
            if r["phase"] == phase and v is not None:
                speeds[traffic_class(r)][pool].append(v)
    out: dict[str, str] = {}
    for cls, by_pool in speeds.items():
        if len(by_pool) >= 2:
            out[cls] = max(by_pool, key=lambda p: statistics.median(by_pool[p]))
    return out


def better_servers(fleets: Mapping[str, Sequence[Row]], phase: int, better: Mapping[str, str]) -> dict[str, str]:
    """class -> what served most verification steps of its better fleet's requests in `phase` (a drafter
    kind, or `plain`: the all-DFly fleet's D-Cut may have run a class plain, and then plain decoding is
    what made that fleet the faster); the pool's name where the rows do not say."""
    out: dict[str, str] = {}
    for cls, pool in better.items():
        arm = next((a for a, p in FLEET_POOLS.items() if p == pool), None)
        steps: dict[str, float] = defaultdict(float)
        for r in fleets.get(arm or "", ()):
            if r["phase"] == phase and r["ok"] and traffic_class(r) == cls:
                for k, v in (r.get("drafter_steps") or {}).items():
                    steps[k] += v
        out[cls] = max(sorted(steps), key=lambda k: steps[k]) if steps else pool
    return out


def switch_point(rows: Sequence[Row], change_phase: int, baseline: Mapping[str, str], after: Mapping[str, str],
                 window: int = 50, target: float = 0.9,
                 on: Callable[[Row], str] = labelled_pool, targets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """When `target` of the affected traffic (classes whose better pool `after` is not their `baseline`
    pool) after `change_phase` starts is on its better pool (`on`: where a request counts as being:
    `labelled_pool`, or `served_by` with `targets` from `better_servers`)."""
    goal = targets or after
    affected_classes = sorted(c for c, p in after.items() if baseline.get(c) != p)
    post = sorted((r for r in rows if r["phase"] >= change_phase), key=lambda r: r["index"])
    aff = [r for r in post if traffic_class(r) in affected_classes]
    out: dict[str, Any] = {"affected_classes": {c: goal.get(c, after[c]) for c in affected_classes},
                           "affected_requests": len(aff),
                           "requests_until_90pct": None, "affected_requests_until_90pct": None}
    if not aff:
        return out
    good = [1.0 if on(r) == goal.get(traffic_class(r), after[traffic_class(r)]) else 0.0 for r in aff]
    w = min(window, len(aff))
    for j in range(len(aff) - w + 1):
        if sum(good[j:j + w]) >= target * w - 1e-9:
            out["affected_requests_until_90pct"] = j
            out["requests_until_90pct"] = aff[j]["index"] - post[0]["index"]
            break
    tail = good[-max(1, len(good) // 4):]
    out["final_quarter_on_better_pool"] = round(sum(tail) / len(tail), 3)
    return out


def switch_baseline(better: Mapping[int, Mapping[str, str]], change_phase: int) -> dict[str, str]:
    """class -> the pool a router should have used just before `change_phase`: the better pool measured
    in the phase before the change, the default policy's pool for a class that phase did not have.
    A switch is then a reaction to the change, not a departure from the default policy."""
    after = better.get(change_phase, {})
    before = better.get(change_phase - 1, {})
    return {c: before.get(c, default_pools([c])[c]) for c in after}


def paired_interval(ratios: Sequence[float], n_boot: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """A paired comparison from per-round relative differences (arm against reference, one value per
    round: the arms of a round run back to back): their median and mean, and a percentile bootstrap
    95% interval of the mean (rounds resampled with replacement; with few rounds it is wide, as it
    should be). Deterministic for a seed."""
    xs = [float(x) for x in ratios]
    if not xs:
        return {"rounds": 0, "median": None, "mean": None, "ci95": None}
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(rng.choice(xs) for _ in range(n)) / n for _ in range(n_boot))
    lo, hi = means[int(0.025 * (n_boot - 1))], means[int(0.975 * (n_boot - 1))]
    return {"rounds": n, "median": round(statistics.median(xs), 4), "mean": round(sum(xs) / n, 4),
            "ci95": [round(lo, 4), round(hi, 4)]}


def median_round(tps: Sequence[float]) -> int:
    """The index of the median of rounds' tokens/s (the lower of the middle two for an even count)."""
    order = sorted(range(len(tps)), key=lambda i: (tps[i], i))
    return order[(len(order) - 1) // 2]


def regret(tps: Mapping[str, float]) -> dict[str, Any]:
    """Per arm: the shortfall against the best arm, in tokens/s and relative."""
    if not tps:
        return {}
    best = max(tps, key=lambda a: tps[a])
    b = tps[best]
    return {"best_arm": best, "best_tokens_per_s": b,
            "regret": {a: {"tokens_per_s": round(b - v, 2), "relative": round(1 - v / b, 4) if b > 0 else None}
                       for a, v in tps.items()}}


def paired_regret(rounds: Mapping[str, Sequence[float]], best: str) -> dict[str, Any]:
    """Per arm: its shortfall against `best` round by round (the arms of one round run back to back, minutes
    apart, so each round's ratio cancels the machine's drift between rounds), the median of those, and
    `interval95`: the arm's per-round gain against `best` (v / b - 1) with a bootstrap 95% interval
    (`paired_interval`)."""
    ref = rounds.get(best, ())
    out: dict[str, Any] = {"reference": best, "relative_by_round": {}, "median_relative": {}, "interval95": {}}
    for arm, tps in rounds.items():
        pairs = [(v, b) for v, b in zip(tps, ref, strict=False) if b > 0]
        if pairs:
            out["relative_by_round"][arm] = [round(1 - v / b, 4) for v, b in pairs]
            out["median_relative"][arm] = round(statistics.median(1 - v / b for v, b in pairs), 4)
            out["interval95"][arm] = paired_interval([v / b - 1 for v, b in pairs])
    return out


def identity(texts: Mapping[str, Mapping[int, str]], reference: str | None = None,
             max_examples: int = 5) -> dict[str, Any]:
    """Temperature-0 outputs per arm (index -> text): how many differ from the reference arm's."""
    arms = [a for a in texts if texts[a]]
    if len(arms) < 2:
        return {"compared": 0, "mismatches": 0, "reference": None, "examples": []}
    ref = reference if reference in arms else arms[0]
    compared = mismatches = 0
    examples: list[dict[str, Any]] = []
    for arm in arms:
        if arm == ref:
            continue
        for i, text in texts[arm].items():
            if i not in texts[ref]:
                continue
            compared += 1
            if text != texts[ref][i]:
                mismatches += 1
                if len(examples) < max_examples:
                    examples.append({"arm": arm, "index": i, "reference": texts[ref][i][:120], "got": text[:120]})
    return {"compared": compared, "mismatches": mismatches, "reference": ref, "examples": examples}


def suite_totals(cells: Iterable[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Per arm over every cell: total tokens over total wall time; each learning arm against the best
    single-pool fleet (all-MTP, all-DFly, all-AR) and against classifier-static."""
    tok: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    for cell in cells:
        for arm, s in cell.items():
            tok[arm] += s["output_tokens"]
            wall[arm] += s["wall_s"]
    tps = {a: round(tok[a] / wall[a], 2) if wall[a] > 0 else 0.0 for a in tok}
    out: dict[str, Any] = {"output_tokens_per_s": tps}
    fleets = {a: v for a, v in tps.items() if a in FLEET_POOLS}
    routed = [a for a in LEARNED_ARMS if a in tps]
    if fleets:
        best = max(fleets, key=lambda a: fleets[a])
        out["best_static_arm"] = best
        out["routed_vs_best_static"] = {a: round(tps[a] / fleets[best] - 1, 4) if fleets[best] > 0 else math.nan
                                        for a in routed}
    if tps.get("static"):
        out["routed_vs_classifier_static"] = {a: round(tps[a] / tps["static"] - 1, 4) for a in routed}
    for key in ("routed_vs_best_static", "routed_vs_classifier_static"):   # the learned (1+1) arm's, as before
        if "learned" in out.get(key, {}):
            out[key.replace("routed", "learned")] = out[key]["learned"]
    return out
