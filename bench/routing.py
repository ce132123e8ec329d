"""`specroute bench routing --out bench/results/`: routing policies against static fleets, end to end.

The system as users run it: real workers (`specroute worker`, one torch thread each), a real gateway
(`specroute gateway`) and a real Redis; the load generator streams chat completions over HTTP.
Every arm is two worker processes (bench/routing_system.py `ARMS`):

    all-mtp    2 x MTP                 all-dfly   2 x DFly + D-Cut          all-ar   2 x AR
    static     1 MTP + 1 DFly + D-Cut, the built-in default policy (classifier routes) with learning off
    learned    the same two workers, the built-in default policy with learning on
    learned-shared  2 x (MTP + DFly modes over one target), pools mtp and dfly on both, learning on; each
               worker narrows DFly rows or takes plain steps where its step cost model says so
    all-mtp-twin   all-MTP again on two more processes, the noise control (only when --arms names it)
    learned-shared-least  learned-shared with the gateway balancing on load alone, no batch affinity
               (router/routing/affinity.py): the affinity control (only when --arms names it)

Scenarios (bench/routing_trace.py `SCENARIOS`): S1 code/math heavy at T=0; S2 chat heavy, T in
{0, 0.7, 1}; S3 drift S1 -> S2; S4 S1 traffic whose DFly drafter goes bad mid-run (SIGUSR1 to the
arm's DFly workers: noise on the drafter's weights, engines/worker/degrade.py; restored after the
cell); S5 load surge at concurrency 2 -> 16 -> 2; S6 half non-English prompts. Each scenario runs at
every `--concurrency` level (S5 at its own levels): one cell per (scenario, level); S3 and S4 run twice
`--requests-per-scenario`, so that as many requests follow the change. Traces are built
once per cell from held-out prompts and replayed identically to every arm.

Cells run one after another, each cell's arms back to back (a fresh gateway and fresh worker processes
per arm and round, unless `--shared-workers`; the arm order rotated from cell to cell), so the arms a
cell compares run minutes apart on a machine whose speed drifts, not an hour. Per cell and arm: the statistics are deleted, `--warmup-requests` unmeasured
requests of the cell's first phase let learning (and the workers' caches) warm up, then the trace runs
closed-loop, one segment per phase. Reported: output tokens/s, TTFT and end-to-end p50/p99, mean
accepted length, routing shares and goodput over time, regret against the best arm, for S3/S4 the
requests until 90% of the affected traffic (classes whose better pool changed with the change) is on
the better pool (by the router's label, and by the drafter that served most of each request's steps:
bench/routing_metrics.py), whether
T=0 outputs are identical across arms, suite totals, and the routing ceiling: how far above the best
single-pool fleet a router sending each class, or each request, to its fastest fleet could get, per
cell and over the suite (bench/routing_ceiling.py). `--repeats N` runs every cell's arms N rounds
(the order rotated each round): an arm's figures are then its median round's, with every round's
tokens/s beside them, and the suite totals count every round. Writes `<name>.json`, `<name>.png` and the per-request
rows (texts of T=0 requests included) in `<name>-requests.jsonl.gz`.

CPU: the workers, the gateway, Redis and the load generator share the machine; on a 2-core machine
they compete, so absolute numbers are lower and noisier than on a larger one (the JSON records the
CPU count and load averages).

    specroute bench routing --out bench/results/ --repeats 3                       # full run
    specroute bench routing --scenarios S1,S4 --arms all-dfly,learned --requests-per-scenario 20 \\
        --warmup-requests 10 --max-tokens 32 --name routing-smoke                 # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import common
from bench.routing_ceiling import cell_ceiling, suite_ceiling
from bench.routing_client import Result, run_segment
from bench.routing_metrics import (
    FLEET_POOLS,
    ROUTED_ARMS,
    better_pools,
    better_servers,
    identity,
    median_round,
    paired_regret,
    regret,
    served_by,
    suite_totals,
    summarize,
    switch_baseline,
    switch_point,
)
from bench.routing_metrics import time_series as series
from bench.routing_plot import plot, table
from bench.routing_system import ARMS, CONTROL_ARMS, DEFAULT_ARMS, Arm, System
from bench.routing_trace import (
    SCENARIOS,
    PromptPool,
    Scenario,
    TraceItem,
    build_trace,
    read_prompts,
    segments,
)
from engines.dcut.profile import cpu_name
from specroute.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def parse_names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UserError(f"--{what}: unknown {', '.join(bad) or '(none given)'} (choose from {', '.join(known)})")
    return list(dict.fromkeys(names))


def parse_levels(text: str) -> list[int]:
    return list(dict.fromkeys(common.parse_levels(text, "4,16")))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specroute bench routing", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/", help="output directory")
    ap.add_argument("--name", default="routing", help="file name stem of the outputs (default routing)")
    ap.add_argument("--model", default=str(REPO / "models" / "demo"), help="model bundle (default models/demo)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="subset, e.g. S1,S3")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                    help=f"subset of {','.join(ARMS)} (default: all but the noise control {','.join(CONTROL_ARMS)})")
    ap.add_argument("--concurrency", default="8", help="closed-loop clients, e.g. 4,16 (each level a cell; S5 runs "
                                                       "at 2, 16, 2 whatever this says)")
    ap.add_argument("--requests-per-scenario", type=int, default=250,
                    help="measured requests per cell (S3 and S4: twice as many)")
    ap.add_argument("--warmup-requests", type=int, default=40, help="unmeasured requests before each cell and arm")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--degrade-noise", type=float, default=3.0, help="S4: noise on the DFly drafter (weight stds)")
    ap.add_argument("--bins", type=int, default=12, help="time slices of the per-cell series")
    ap.add_argument("--switch-window", type=int, default=50, help="affected requests per window of the 90%% test")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds per cell: every arm runs the cell's trace this many times, the arm order rotated "
                         "each round; an arm's tokens/s is its median round's, the suite counts every round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shared-workers", action="store_true",
                    help="reuse the worker processes across arms (default: every arm and round starts its own "
                         "workers, so no D-Cut or step-cost state carries over from another arm)")
    ap.add_argument("--log-dir", default=None, help="process logs (default <out>/tmp/routing-logs)")
    return ap


def cells_of(scenarios: list[str], levels: list[int]) -> list[tuple[str, Scenario, int]]:
    out = []
    for name in scenarios:
        sc = SCENARIOS[name]
        if all(ph.concurrency is not None for ph in sc.phases):
            out.append((name, sc, 0))
        else:
            out.extend((f"{name}@c{c}", sc, c) for c in levels)
    return out


def run_trace(system: System, arm: Arm, sc: Scenario, warm: list[TraceItem], trace: list[TraceItem],
              max_tokens: int) -> tuple[list[Result], list[float]]:
    """Warm up, then the measured segments (S4's fault between them); returns results and phase starts."""
    port = system.gateway_port
    dfly = list(dict.fromkeys(k for ks in arm.pools.values() for k in ks if k[0] in ("dfly", "multi")))
    system.reset_stats()
    time.sleep(1.5)   # every gateway's snapshot has pulled the empty statistics

    async def go() -> tuple[list[Result], list[float]]:
        if warm:
            await run_segment("127.0.0.1", port, warm, warm[0].concurrency, max_tokens, time.perf_counter())
        t0 = time.perf_counter()
        out: list[Result] = []
        starts: list[float] = []
        for seg in segments(trace):
            if sc.fault_at_phase is not None and seg[0].phase == sc.fault_at_phase and dfly:
                system.signal_workers(dfly, signal.SIGUSR1)
                await asyncio.sleep(0.3)
            starts.append(round(time.perf_counter() - t0, 3))
            out += await run_segment("127.0.0.1", port, seg, seg[0].concurrency, max_tokens, t0)
        return out, starts

    try:
        return asyncio.run(go())
    finally:
        if sc.fault_at_phase is not None and dfly:
            system.signal_workers(dfly, signal.SIGUSR2)
            time.sleep(0.3)


def analyse(name: str, sc: Scenario, conc: int, rounds: dict[str, list[list[dict[str, Any]]]],
            starts: dict[str, list[list[float]]], bins: int, window: int) -> dict[str, Any]:
    """One cell: per arm its median round (by output tokens/s; the lower of the middle two for an even
    count) gives the summary, series and switch, with every round's tokens/s beside it; better pools
    come from every round of the fleets, the T=0 identity compares every round of every arm."""
    pick = {arm: median_round([summarize(rs)["output_tokens_per_s"] for rs in rr]) for arm, rr in rounds.items()}
    rows = {arm: rr[pick[arm]] for arm, rr in rounds.items()}
    arms = {arm: {"summary": summarize(rs), "series": series(rs, bins), "phase_starts_s": starts[arm][pick[arm]]}
            for arm, rs in rows.items()}
    if any(len(rr) > 1 for rr in rounds.values()):
        for arm, rr in rounds.items():
            arms[arm]["rounds_output_tokens_per_s"] = [summarize(rs)["output_tokens_per_s"] for rs in rr]
            arms[arm]["median_round"] = pick[arm] + 1
    fleets = {a: [r for rs in rr for r in rs] for a, rr in rounds.items() if a in FLEET_POOLS}
    better = {ph: better_pools(fleets, ph) for ph in range(len(sc.phases))}
    change = 1 if len(sc.phases) > 1 and (name.startswith("S3") or sc.fault_at_phase is not None) else None
    base: dict[str, str] = {}
    if change is not None:
        servers = better_servers(fleets, change, better[change])
        base = switch_baseline(better, change)   # the best pool before the change, not the default policy's
        for arm in ROUTED_ARMS:
            if arm in rows:
                arms[arm]["switch"] = switch_point(rows[arm], change, base, better[change], window)
                arms[arm]["switch_by_drafter"] = switch_point(rows[arm], change, base, better[change], window,
                                                              on=served_by, targets=servers)
    reg = regret({a: v["summary"]["output_tokens_per_s"] for a, v in arms.items()})
    if reg and any(len(rr) > 1 for rr in rounds.values()):
        reg["paired"] = paired_regret({a: v["rounds_output_tokens_per_s"] for a, v in arms.items()}, reg["best_arm"])
    t0_texts = {arm if len(rr) == 1 else f"{arm}#{k + 1}":
                {r["index"]: r["text"] for r in rs if r["ok"] and r["temperature"] == 0.0 and "text" in r}
                for arm, rr in rounds.items() for k, rs in enumerate(rr)}
    return {"cell": name, "scenario": sc.name, "title": sc.title, "concurrency": conc or None,
            "phases": [{"share": ph.share, "domains": dict(ph.domains),
                        "temperatures": {str(k): v for k, v in ph.temperatures.items()},
                        "non_english": ph.non_english, "concurrency": ph.concurrency or conc} for ph in sc.phases],
            "arms": arms, "regret": reg,
            "better_pools": {str(k): v for k, v in better.items()}, "ceiling": cell_ceiling(fleets),
            **({"switch_baseline": base} if change is not None else {}),
            "t0_identity": identity(t0_texts, reference=next((a for a in t0_texts if a.split("#")[0] == "all-ar"), None))}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    scenarios = parse_names(args.scenarios, list(SCENARIOS), "scenarios")
    arm_names = parse_names(args.arms, list(ARMS), "arms")
    levels = parse_levels(args.concurrency)
    if args.requests_per_scenario < 2 or args.warmup_requests < 0 or args.max_tokens < 1 or args.repeats < 1:
        raise UserError("--requests-per-scenario >= 2, --warmup-requests >= 0, --max-tokens >= 1 and --repeats >= 1 "
                        "please")
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UserError(f"no model bundle at {model}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(args.log_dir) if args.log_dir else out / "tmp" / "routing-logs"

    from engines.training.data import data_dir

    prompts = read_prompts(data_dir())
    if not prompts:
        raise UserError(f"no held-out prompts under {data_dir()}/prompts")
    cells = cells_of(scenarios, levels)
    traces: dict[str, tuple[list[TraceItem], list[TraceItem]]] = {}
    for name, sc, conc in cells:
        pool = PromptPool(prompts, args.seed)   # the same draws for every arm; warm-up prompts first
        warm = build_trace(sc, args.warmup_requests, conc, pool, args.seed, phase=0) if args.warmup_requests else []
        n = max(2, round(args.requests_per_scenario * sc.requests_factor))
        traces[name] = (warm, build_trace(sc, n, conc, pool, args.seed))

    load0 = os.getloadavg()
    t_start = time.time()
    system = System(model, log_dir, args.degrade_noise, args.seed)
    rows: dict[str, dict[str, list[list[dict[str, Any]]]]] = {name: {} for name, _, _ in cells}   # per round
    starts: dict[str, dict[str, list[list[float]]]] = {name: {} for name, _, _ in cells}
    pids: dict[str, dict[str, list[dict[str, int]]]] = {name: {} for name, _, _ in cells}   # fresh workers per run
    try:
        system.start_redis()
        keys = list(dict.fromkeys(k for a in arm_names for ks in ARMS[a].pools.values() for k in ks))
        if args.shared_workers:   # otherwise every arm and round starts its own (restart_workers below)
            print(f"starting {len(keys)} workers ({', '.join(f'{e}#{i}' for e, i in keys)}) ...", flush=True)
            t_w = time.perf_counter()
            system.start_workers(keys)
            print(f"workers ready in {time.perf_counter() - t_w:.0f}s", flush=True)
        for c, (name, sc, _) in enumerate(cells):   # cell by cell: a cell's arms run minutes apart, not an hour
            warm, trace = traces[name]
            for rnd in range(args.repeats):
                off = (c + rnd) % len(arm_names)
                for arm_name in arm_names[off:] + arm_names[:off]:
                    arm = ARMS[arm_name]
                    if not args.shared_workers:
                        own = list(dict.fromkeys(k for ks in arm.pools.values() for k in ks))
                        pids[name].setdefault(arm_name, []).append(system.restart_workers(own))
                    system.start_gateway(arm)
                    t_c = time.perf_counter()
                    res, st = run_trace(system, arm, sc, warm, trace, args.max_tokens)
                    got = [r.row(with_text=r.item.temperature == 0.0) for r in res]
                    rows[name].setdefault(arm_name, []).append(got)
                    starts[name].setdefault(arm_name, []).append(st)
                    s = summarize(got)
                    tag = f"{name} r{rnd + 1}" if args.repeats > 1 else name
                    print(f"{tag:<8} {arm_name:<9} {s['output_tokens_per_s']:7.1f} tok/s  errors {s['errors']}  "
                          f"shares {s['pool_shares']}  ({time.perf_counter() - t_c:.0f}s)", flush=True)
    finally:
        system.close()

    results = [analyse(name, sc, conc, {a: rows[name][a] for a in arm_names if a in rows[name]}, starts[name],
                       args.bins, args.switch_window)
               for name, sc, conc in cells]
    report: dict[str, Any] = {
        "benchmark": "routing",
        "meta": {"model": model.name, "arms": {a: {p: [f"{e}#{i}" for e, i in ks] for p, ks in ARMS[a].pools.items()}
                                               for a in arm_names},
                 "scenarios": scenarios, "concurrency": levels, "requests_per_scenario": args.requests_per_scenario,
                 "warmup_requests": args.warmup_requests, "max_tokens": args.max_tokens,
                 "degrade_noise": args.degrade_noise, "seed": args.seed, "repeats": args.repeats, "threads_per_worker": 1,
                 "cpu": cpu_name(), "cpu_count": os.cpu_count(), "loadavg_start": load0, "loadavg_end": os.getloadavg(),
                 "machine": platform.machine(), "python": platform.python_version(), "time": t_start,
                 "wall_s": round(time.time() - t_start, 1), "data_dir": str(data_dir()),
                 "heldout_prompts": len(prompts), "fresh_workers": not args.shared_workers,
                 **({"worker_pids": pids} if not args.shared_workers else {})},
        "notes": [
            "prompts: the held-out split (specroute.contracts.split.is_heldout, 10% by id hash) of every source: "
            "the target, the drafters and the classifier's final model were all trained without them",
            "all processes (2 workers x 1 torch thread, gateway, Redis, load generator) share the machine's CPUs",
            "per cell and arm: statistics deleted, then --warmup-requests unmeasured requests of the first phase",
            "cell by cell: a cell's arms back to back, each on a fresh gateway, the arm order rotated per cell "
            "and per round",
            "workers: " + ("shared across arms (--shared-workers): D-Cut and step-cost state carries over"
                           if args.shared_workers else "every arm and round on worker processes started for it "
                           "(meta.worker_pids: each run's pids, none reused)"),
            f"{args.repeats} round(s) per cell and arm: an arm's figures are its median round's (by output tokens/s); "
            "the suite totals count every round",
        ],
        "cells": results,
        "suite": suite_totals({a: summarize(rr[k]) for a, rr in by_arm.items()}
                              for by_arm in rows.values() for k in range(args.repeats)),
    }
    if "best_static_arm" in report["suite"]:
        walls = {name: {a: sum(summarize(rs)["wall_s"] for rs in rr) for a, rr in rows[name].items()}
                 for name, _, _ in cells}
        report["suite"]["ceiling"] = suite_ceiling([(res["ceiling"], walls[res["cell"]]) for res in results],
                                                   report["suite"]["best_static_arm"])
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=2))
    with gzip.open(out / f"{args.name}-requests.jsonl.gz", "wt", encoding="utf-8") as f:
        for name, by_arm in rows.items():
            for arm_name, rr in by_arm.items():
                for k, rs in enumerate(rr):
                    for r in rs:
                        f.write(json.dumps({"cell": name, "arm": arm_name, "round": k + 1, **r}, ensure_ascii=False)
                                + "\n")
    plot(report, out / f"{args.name}.png")
    print(table(report))
    print(f"wrote {out / (args.name + '.json')}, {out / (args.name + '.png')}")
    return 0
