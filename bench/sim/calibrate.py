"""`specroute sim calibrate`: the simulator against a measured `bench routing` run on this kind of CPU.

Every arm x scenario of the run is simulated on the traffic its single-mode fleets logged (each
round's own, bench/sim/traffic.py), with the step-cost profile `specroute sim profile` measured here;
an arm's simulated figure is its median round's output tokens/s, as the benchmark reports the
measured one. The profile is taken on one machine and the run on another, with two workers, a
gateway, Redis and the load generator sharing two cores: one wall-time factor (`scale`) is fitted on
the all-AR arm alone (the one whose steps have no drafter: the machine's speed and contention) and
every other arm is a check of the model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bench.sim.core import Gateway, Request, SimResult, TableProfile, simulate
from bench.sim.traffic import arm_fleet

FIT_ARM = "all-ar"


def arm_results(traffic: Mapping[tuple[str, int], list[Request]], scenario: str, arm: str,
                profile: TableProfile, scale: float, slack: float = 1.0) -> dict[int, SimResult]:
    """round -> the simulated run of `arm` on that round's traffic of `scenario`."""
    fleet, policy = arm_fleet(arm)
    gw = Gateway(policy, affinity_slack=0.0 if arm == "learned-shared-least" else slack,
                 compute_bound_tokens=profile.compute_bound_tokens())
    return {rnd: simulate(reqs, fleet, profile, gw, seed=rnd, scale=scale)
            for (scen, rnd), reqs in sorted(traffic.items()) if scen == scenario}


def arm_rounds(traffic: Mapping[tuple[str, int], list[Request]], scenario: str, arm: str,
               profile: TableProfile, scale: float) -> list[float]:
    return [r.output_tokens_per_s() for r in arm_results(traffic, scenario, arm, profile, scale).values()]


def _rate(spans: Sequence[tuple[float, float, int]]) -> float:
    """Output tokens/s of requests (send, end, tokens): their tokens over their span."""
    wall = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    return sum(n for _, _, n in spans) / wall if wall > 0 else 0.0


# scenario -> arm -> phase -> the run's measured output tokens/s in that phase (median over rounds)
PhaseFigures = Mapping[str, Mapping[str, Mapping[str, float]]]


def phase_rates(log: Sequence[Mapping[str, Any]] | None, traffic: Mapping[tuple[str, int], list[Request]],
                scenario: str, arm: str, results: Mapping[int, SimResult],
                measured: PhaseFigures | None = None) -> dict[str, dict[str, float]]:
    """phase -> measured and simulated output tokens/s (median over rounds) of one arm x scenario; the
    measured side from the run's request `log`, else from `measured` (`measured_phases`)."""
    phases = sorted({r.phase for (s, _), reqs in traffic.items() if s == scenario for r in reqs})
    out: dict[str, dict[str, float]] = {}
    for ph in phases:
        meas, sim = [], []
        for rnd, res in results.items():
            rows = [r for r in log or () if str(r["cell"]).split("@")[0] == scenario and r["arm"] == arm
                    and int(r["round"]) == rnd and int(r["phase"]) == ph]
            if rows:
                meas.append(_rate([(r["t_send"], r["t_end"], int(r["completion_tokens"])) for r in rows]))
            idx = {r.index for r in traffic[(scenario, rnd)] if r.phase == ph and r.measured}
            spans = [(o.t_send, o.t_end, o.tokens) for o in res.measured if o.index in idx]
            if spans:
                sim.append(_rate(spans))
        if not meas and measured is not None and str(ph) in measured.get(scenario, {}).get(arm, {}):
            meas = [measured[scenario][arm][str(ph)]]
        if meas and sim:
            m, s_ = statistics.median(meas), statistics.median(sim)
            out[str(ph)] = {"measured_tokens_per_s": round(m, 1), "simulated_tokens_per_s": round(s_, 1),
                            "relative_error": round(s_ / m - 1.0, 4)}
    return out


def fit_scale(traffic: Mapping[tuple[str, int], list[Request]], measured: Mapping[str, Mapping[str, float]],
              profile: TableProfile, arm: str = FIT_ARM) -> float:
    """The wall-time factor that brings `arm`'s simulated tokens/s to the measured, over every scenario
    (geometric mean of the ratios; two passes, the overheads being fixed)."""
    scale = 1.0
    for _ in range(2):
        ratios = [statistics.median(arm_rounds(traffic, s, arm, profile, scale)) / m[arm]
                  for s, m in measured.items() if arm in m]
        scale *= statistics.geometric_mean(ratios)
    return scale


def measured_figures(run: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """scenario -> arm -> the run's output tokens/s (its median round)."""
    return {c["scenario"]: {a: float(v["summary"]["output_tokens_per_s"]) for a, v in c["arms"].items()}
            for c in run["cells"]}


def measured_phases(doc: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """The measured per-phase figures of an earlier calibration (`cells[scenario][arm].phases`): the
    run's, for when its request log is not kept."""
    return {scen: {arm: {ph: float(x["measured_tokens_per_s"]) for ph, x in v["phases"].items()}
                   for arm, v in arms.items() if "phases" in v}
            for scen, arms in doc.get("cells", {}).items()}


def calibrate(traffic: Mapping[tuple[str, int], list[Request]], run: Mapping[str, Any], profile_doc: Mapping[str, Any],
              arms: Sequence[str] | None = None, command: str = "",
              log: Sequence[Mapping[str, Any]] | None = None, phases: PhaseFigures | None = None) -> dict[str, Any]:
    """Every arm x scenario of `run`, simulated; with the run's request `log` (or its measured per-phase
    figures, `phases`), also per phase of the scenarios that have several (where the load or the
    traffic changes)."""
    t0 = time.time()
    profile = TableProfile.from_doc(profile_doc)
    measured = measured_figures(run)
    scale = fit_scale(traffic, measured, profile)
    table: dict[str, dict[str, Any]] = {}
    errors = []
    for scen, arms_m in measured.items():
        for arm, meas in arms_m.items():
            if arms and arm not in arms:
                continue
            results = arm_results(traffic, scen, arm, profile, scale)
            rounds = [r.output_tokens_per_s() for r in results.values()]
            sim = statistics.median(rounds)
            err = (sim - meas) / meas
            errors.append(abs(err))
            table.setdefault(scen, {})[arm] = {
                "measured_tokens_per_s": round(meas, 2), "simulated_tokens_per_s": round(sim, 2),
                "simulated_rounds": [round(x, 2) for x in rounds], "relative_error": round(err, 4),
                "fitted": arm == FIT_ARM, "within_10pct": abs(err) <= 0.10}
            if (log is not None or phases is not None) and len(run_phases(run, scen)) > 1:
                per = phase_rates(log, traffic, scen, arm, results, phases)
                if per:
                    table[scen][arm]["phases"] = per
    checks = [abs(v["relative_error"]) for s in table.values() for a, v in s.items() if a != FIT_ARM]
    return {
        "benchmark": "sim-calibration",
        "meta": {
            "command": command, "run_cpu": run["meta"].get("cpu", ""), "run_model": run["meta"].get("model"),
            "profile_cpu": profile_doc.get("cpu", ""), "profile": {k: profile_doc[k] for k in ("threads", "context")},
            "scale": round(scale, 4),
            "scale_fitted_on": f"{FIT_ARM}, every scenario (geometric mean of simulated / measured tokens/s)",
            "compute_bound_tokens": round(profile.compute_bound_tokens(), 2),
            "wall_s": round(time.time() - t0, 1),
        },
        "notes": [
            "measured: the run's median round per arm x scenario (bench routing's summary); simulated: the median "
            "of the simulated rounds, each replaying that round's logged requests",
            "replay per request from the run's single-mode fleets (all-MTP, all-DFly + D-Cut, all-AR) on the same "
            "prompts in the same round; learned-shared's DFly rows replay the D-Cut worker's steps",
            f"one factor fitted: scale (wall time per profiled ms) on {FIT_ARM}; every other arm is a check",
            "profile: thread CPU time on the profiling machine; the run: wall time on its own machine, two workers, "
            "the gateway, Redis and the load generator sharing two cores: 'scale' carries both, at the run's "
            "concurrency, where both workers step all the time; where one worker steps while the other idles (S5's "
            "concurrency-2 phases: the gateway balances on a polled load up to a second old, ties broken at random, "
            "so both requests often share one worker) that worker has the machine more to itself than 'scale' says, "
            "and the simulated figure is low",
            "per phase without the run's request log: the measured side from an earlier calibration of the same run "
            "(meta.inputs.phases_from)",
        ],
        "summary": {
            "cells": len(errors), "within_10pct": sum(e <= 0.10 for e in errors),
            "max_abs_relative_error": round(max(errors), 4) if errors else None,
            "checked_cells_max_abs_relative_error": round(max(checks), 4) if checks else None,
            "misses": [f"{scen} {arm}: {v['relative_error']:+.1%}" + (
                " (phases: " + ", ".join(f"{p} {x['relative_error']:+.1%}" for p, x in v["phases"].items()) + ")"
                if "phases" in v else "") for scen, arms_t in table.items() for arm, v in arms_t.items()
                if not v["within_10pct"]],
        },
        "cells": table,
    }


def run_phases(run: Mapping[str, Any], scenario: str) -> list[Any]:
    return next((c.get("phases") or [] for c in run["cells"] if c["scenario"] == scenario), [])
