"""Simulated: what learned routing gains over the best static fleet on the Hy3 GPU profile, for the
scenarios of `bench routing` (bench/routing_trace.py `SCENARIOS`).

Two Hy3 nodes (8 x H20 each, the profile of bench/sim/hy3.py fitted to the AR column, shared over the
benchmarks) per arm, as `bench routing`'s arms are two workers: all-MTP-3, all-DFly-8, all-AR,
classifier-static and learned over one MTP-3 and one DFly-8 node, and learned over two nodes serving
both modes (a step pads to its widest row). The scenarios' domain, temperature, language and phase
mixes are drawn as the benchmark draws them (seeded); each request's acceptance is drawn around its
domain's serving accepted length (hy3.py: the offline figures times the factor fitted at c4): chat
from MT-Bench, code from HumanEval / MBPP / LiveCodeBench, math from GSM8K / Math500. The paper has
T=1 figures only: every temperature gets them. S4's DFly drafter goes bad in its second phase
(accepted length 1.3). Concurrency is the benchmark's times `load` (GPU nodes batch far more rows
than the CPU workers: x4 and x16, c32 and c128 over two nodes); output 256-768 tokens a request, no
prefill.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping
from typing import Any

from bench.routing_trace import SCENARIOS
from bench.sim.core import Fleet, Gateway, Replay, Request, Worker, simulate
from bench.sim.gateway_policy import Policy, RequestContext, default_policy
from bench.sim.hy3 import BENCHMARKS, DRAFTS, MAL, Hy3Profile
from specroute.contracts.context import temperature_bucket

DOMAIN_BENCHMARKS = {"chat": ("MT-Bench",), "code": ("HumanEval", "MBPP", "LiveCodeBench"), "math": ("GSM8K", "Math500")}
METHOD_OF = {"mtp": "MTP-3", "dfly": "DFly-8"}
FAULTY_MAL = 1.3
ARMS = ("all-mtp", "all-dfly", "all-ar", "static", "learned", "learned-shared")


def domain_mal(factor: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """mode -> domain -> serving accepted length."""
    return {mode: {d: statistics.fmean(MAL[m][b] for b in bs) * factor[m] for d, bs in DOMAIN_BENCHMARKS.items()}
            for mode, m in METHOD_OF.items()}


def scenario_traffic(name: str, n: int, concurrency: int, mal: Mapping[str, Mapping[str, float]],
                     seed: int, warmup: int = 40) -> list[Request]:
    """`n` requests of scenario `name` (and `warmup` unmeasured ones of its first phase first)."""
    from bench.routing_trace import phase_sizes

    sc = SCENARIOS[name]
    rng = random.Random(f"{seed}:{name}")
    out: list[Request] = []
    plan = [(0, warmup, False)] + [(i, k, True) for i, k in enumerate(phase_sizes(sc, int(n * sc.requests_factor)))]
    for ph_i, size, measured in plan:
        ph = sc.phases[ph_i]
        conc = (ph.concurrency or 8) * concurrency // 8
        for _ in range(size):
            domain = rng.choices(list(ph.domains), weights=list(ph.domains.values()))[0]
            temp = rng.choices(list(ph.temperatures), weights=list(ph.temperatures.values()))[0]
            script = "cjk" if rng.random() < ph.non_english else "latin"
            tokens = int(512 * rng.uniform(0.5, 1.5))
            jitter = rng.uniform(0.8, 1.2)
            replay = {"ar": Replay(tokens, tokens - 1)}
            for mode, by_domain in mal.items():
                m = by_domain[domain]
                if mode == "dfly" and sc.fault_at_phase is not None and ph_i >= sc.fault_at_phase and measured:
                    m = FAULTY_MAL
                m = min(1.0 + DRAFTS[mode], m * jitter)
                steps = max(1, round((tokens - 1) / m))
                replay[mode] = Replay(tokens, steps, steps * DRAFTS[mode], max(0, tokens - 1 - steps), steps)
            out.append(Request(len(out), ph_i, max(1, conc), {domain: 1.0}, 0.0, temp, 0, replay,
                               RequestContext("", script, temperature_bucket(temp), "short"), measured))
    return out


def arm_fleet(arm: str) -> tuple[Fleet, Policy]:
    single = {"all-mtp": "mtp", "all-dfly": "dfly", "all-ar": "ar"}
    if arm in single:
        m = single[arm]
        ws = (Worker(f"{m}#0", (m,), 256), Worker(f"{m}#1", (m,), 256))
        return Fleet(ws, {m: tuple((w.name, m) for w in ws)}), default_policy([m])
    policy = default_policy(["mtp", "dfly"])
    if arm == "learned-shared":
        ws = (Worker("multi#0", ("mtp", "dfly"), 256), Worker("multi#1", ("mtp", "dfly"), 256))
        return Fleet(ws, {m: tuple((w.name, m) for w in ws) for m in ("mtp", "dfly")}), policy
    ws = (Worker("mtp#0", ("mtp",), 256), Worker("dfly#0", ("dfly",), 256))
    if arm == "static":
        policy = policy.model_copy(update={"learning": policy.learning.model_copy(update={"enabled": False})})
    return Fleet(ws, {"mtp": (("mtp#0", "mtp"),), "dfly": (("dfly#0", "dfly"),)}), policy


def run(profile: Hy3Profile, factor: Mapping[str, float], loads: tuple[int, ...] = (4, 16), n: int = 150,
        seeds: int = 3) -> dict[str, Any]:
    """load -> scenario -> arm -> simulated output tokens/s (median over `seeds` traffic draws), and the
    routed arms against the best single fleet. `n` requests a scenario at load 4, in proportion above."""
    mal = domain_mal(factor)
    by_load: dict[str, Any] = {}
    for load in loads:
        size = n * max(1, load // 4)
        out: dict[str, Any] = {}
        for name in SCENARIOS:
            tps: dict[str, list[float]] = {a: [] for a in ARMS}
            for seed in range(seeds):
                reqs = scenario_traffic(name, size, 8 * load, mal, seed)
                for arm in ARMS:
                    fleet, policy = arm_fleet(arm)
                    gw = Gateway(policy, overhead_ms=1.0, compute_bound_tokens=None)
                    tps[arm].append(simulate(reqs, fleet, profile, gw, seed=seed).output_tokens_per_s())
            med = {a: statistics.median(v) for a, v in tps.items()}
            fleets = {a: med[a] for a in ("all-mtp", "all-dfly", "all-ar")}
            best = max(fleets, key=lambda a: fleets[a])
            out[name] = {"title": SCENARIOS[name].title, "tokens_per_s": {a: round(v, 1) for a, v in med.items()},
                         "best_static_fleet": best,
                         "vs_best_static": {a: round(med[a] / fleets[best] - 1.0, 4)
                                            for a in ("static", "learned", "learned-shared")}}
        by_load[f"c{8 * load}"] = {"concurrency_per_fleet": 8 * load, "requests_per_scenario": size, "scenarios": out}
    return {"simulated": True, "seeds": seeds,
            "domain_accepted_length": {m: {d: round(v, 3) for d, v in x.items()} for m, x in mal.items()},
            "benchmarks": list(BENCHMARKS), "loads": by_load}
