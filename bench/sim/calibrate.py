"""`specroute sim calibrate`: the simulator against a measured `bench routing` run on this kind of CPU.

Every arm x scenario of the run is simulated on the traffic its single-mode fleets logged (each
round's own, bench/sim/traffic.py), with the step-cost profile `specroute sim profile` measured here;
an arm's simulated figure is its median round's output tokens/s, as the benchmark reports the
measured one. The profile is taken on one machine and the run on another, with two workers, a
gateway, Redis and the load generator sharing two cores. Two wall-time factors are fitted, both on
the all-AR arm alone (the one whose steps have no drafter: the machine's speed and contention), and
every other arm is a check of the model:

- `scale`, a step's wall time per profiled ms while both workers step: on all-AR's figure in every
  scenario (`fit_scale`);
- `solo`, the factor on `scale` for a step taken while the other worker idles (it has the machine
  more to itself; core.py `contention`): on all-AR's figures in the phases where the clients are no
  more than the workers (S5's concurrency-2 phases), measured per phase (`fit_solo`). Without the
  run's per-phase figures it stays 1 (no contention modelled).

The two are fitted alternately (`fit_factors`), each with the other held, ending on `scale`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bench.sim.core import Gateway, Request, SimResult, TableProfile, simulate
from bench.sim.traffic import arm_fleet

FIT_ARM = "all-ar"


def arm_results(traffic: Mapping[tuple[str, int], list[Request]], scenario: str, arm: str,
                profile: TableProfile, scale: float, slack: float = 1.0, solo: float = 1.0) -> dict[int, SimResult]:
    """round -> the simulated run of `arm` on that round's traffic of `scenario`."""
    fleet, policy = arm_fleet(arm)
    gw = Gateway(policy, affinity_slack=0.0 if arm == "learned-shared-least" else slack,
                 compute_bound_tokens=profile.compute_bound_tokens())
    return {rnd: simulate(reqs, fleet, profile, gw, seed=rnd, scale=scale, solo=solo)
            for (scen, rnd), reqs in sorted(traffic.items()) if scen == scenario}


def arm_rounds(traffic: Mapping[tuple[str, int], list[Request]], scenario: str, arm: str,
               profile: TableProfile, scale: float, solo: float = 1.0) -> list[float]:
    return [r.output_tokens_per_s() for r in arm_results(traffic, scenario, arm, profile, scale, solo=solo).values()]


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
    return {ph: {"measured_tokens_per_s": round(m, 1), "simulated_tokens_per_s": round(s_, 1),
                 "relative_error": round(s_ / m - 1.0, 4)}
            for ph, (m, s_) in _phase_medians(log, traffic, scenario, arm, results, measured).items()}


def _phase_medians(log: Sequence[Mapping[str, Any]] | None, traffic: Mapping[tuple[str, int], list[Request]],
                   scenario: str, arm: str, results: Mapping[int, SimResult],
                   measured: PhaseFigures | None = None) -> dict[str, tuple[float, float]]:
    """phase -> (measured, simulated) output tokens/s, each the median over rounds (`phase_rates`)."""
    phases = sorted({r.phase for (s, _), reqs in traffic.items() if s == scenario for r in reqs})
    out: dict[str, tuple[float, float]] = {}
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
            out[str(ph)] = (statistics.median(meas), statistics.median(sim))
    return out


def fit_scale(traffic: Mapping[tuple[str, int], list[Request]], measured: Mapping[str, Mapping[str, float]],
              profile: TableProfile, arm: str = FIT_ARM, solo: float = 1.0, start: float = 1.0) -> float:
    """The wall-time factor that brings `arm`'s simulated tokens/s to the measured, over every scenario
    (geometric mean of the ratios; two passes from `start`, the overheads being fixed), `solo` held."""
    scale = start
    for _ in range(2):
        ratios = [statistics.median(arm_rounds(traffic, s, arm, profile, scale, solo)) / m[arm]
                  for s, m in measured.items() if arm in m]
        scale *= statistics.geometric_mean(ratios)
    return scale


def low_load_phases(traffic: Mapping[tuple[str, int], list[Request]], workers: int) -> dict[str, set[str]]:
    """scenario -> its phases whose clients are no more than the fleet's `workers` (where a worker often
    steps while another idles), for scenarios of several phases (the only ones measured per phase)."""
    out: dict[str, set[str]] = {}
    for (scen, _), reqs in traffic.items():
        if len({r.phase for r in reqs}) > 1:
            low = {str(r.phase) for r in reqs if r.measured and r.concurrency <= workers}
            if low:
                out.setdefault(scen, set()).update(low)
    return out


def solo_error(traffic: Mapping[tuple[str, int], list[Request]], profile: TableProfile, scale: float, solo: float,
               phases: Mapping[str, set[str]], log: Sequence[Mapping[str, Any]] | None,
               measured: PhaseFigures | None, arm: str = FIT_ARM) -> float | None:
    """log of the geometric mean of simulated / measured tokens/s over `arm`'s `phases` (None: none of them
    has a measured figure)."""
    ratios = []
    for scen, phs in sorted(phases.items()):
        per = _phase_medians(log, traffic, scen, arm, arm_results(traffic, scen, arm, profile, scale, solo=solo),
                             measured)
        ratios += [s_ / m for ph, (m, s_) in per.items() if ph in phs and m > 0 and s_ > 0]
    return math.log(statistics.geometric_mean(ratios)) if ratios else None


def fit_solo(traffic: Mapping[tuple[str, int], list[Request]], profile: TableProfile, scale: float, start: float,
             phases: Mapping[str, set[str]], log: Sequence[Mapping[str, Any]] | None,
             measured: PhaseFigures | None, arm: str = FIT_ARM) -> float | None:
    """The `solo` factor that brings `arm`'s simulated tokens/s in `phases` to the measured (geometric mean),
    `scale` held: secant steps on the log error from `start` (None: no measured phase to fit on)."""
    x0 = start
    g0 = solo_error(traffic, profile, scale, x0, phases, log, measured, arm)
    if g0 is None:
        return None
    x1 = x0 * math.exp(g0)   # as if every step there were taken alone
    for _ in range(6):
        g1 = solo_error(traffic, profile, scale, x1, phases, log, measured, arm)
        if g1 is None or abs(g1) < 1e-3 or g1 == g0:
            break
        x0, x1, g0 = x1, min(3.0, max(0.3, x1 - g1 * (x1 - x0) / (g1 - g0))), g1
    return x1


def fit_factors(traffic: Mapping[tuple[str, int], list[Request]], measured: Mapping[str, Mapping[str, float]],
                profile: TableProfile, log: Sequence[Mapping[str, Any]] | None = None,
                phases: PhaseFigures | None = None, arm: str = FIT_ARM, rounds: int = 2) -> tuple[float, float | None]:
    """`scale` and `solo`, both on `arm` alone: `fit_scale` on its every-scenario figures with `solo` held,
    `fit_solo` on its low-load phases with `scale` held, alternately, ending on `scale` (`solo` None: no
    measured figure of those phases, and `scale` is fitted as with no contention)."""
    low = low_load_phases(traffic, len(arm_fleet(arm)[0].workers))
    scale = fit_scale(traffic, measured, profile, arm)
    solo = fit_solo(traffic, profile, scale, 1.0, low, log, phases, arm) if low else None
    if solo is None:
        return scale, None
    for _ in range(rounds):
        scale = fit_scale(traffic, measured, profile, arm, solo=solo, start=scale)
        solo = fit_solo(traffic, profile, scale, solo, low, log, phases, arm) or solo
    return fit_scale(traffic, measured, profile, arm, solo=solo, start=scale), solo


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
    scale, fitted_solo = fit_factors(traffic, measured, profile, log, phases)
    solo = 1.0 if fitted_solo is None else fitted_solo
    low = low_load_phases(traffic, len(arm_fleet(FIT_ARM)[0].workers))
    low_text = ", ".join(f"{scen} phases {', '.join(sorted(p))}" for scen, p in sorted(low.items())) or "none"
    table: dict[str, dict[str, Any]] = {}
    errors = []
    for scen, arms_m in measured.items():
        for arm, meas in arms_m.items():
            if arms and arm not in arms:
                continue
            results = arm_results(traffic, scen, arm, profile, scale, solo=solo)
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
            "scale_fitted_on": f"{FIT_ARM}, every scenario (geometric mean of simulated / measured tokens/s), "
                               "solo held",
            "solo": round(solo, 4),
            "solo_fitted_on": (
                f"{FIT_ARM}, its phases with no more clients than workers ({low_text}; geometric mean of simulated "
                "/ measured tokens/s), scale held; the two fitted alternately" if fitted_solo is not None else
                f"not fitted: no measured per-phase figure of {FIT_ARM}'s low-load phases ({low_text}; give the "
                "run's --requests or --phases-from): 1, no contention modelled"),
            "contention": "a step's wall time: profiled ms x scale x (1 + (solo - 1) x the other workers idle as it "
                          "starts / (workers - 1)): scale when every worker steps, scale x solo when one steps alone",
            "compute_bound_tokens": round(profile.compute_bound_tokens(), 2),
            "wall_s": round(time.time() - t0, 1),
        },
        "notes": [
            "measured: the run's median round per arm x scenario (bench routing's summary); simulated: the median "
            "of the simulated rounds, each replaying that round's logged requests",
            "replay per request from the run's single-mode fleets (all-MTP, all-DFly + D-Cut, all-AR) on the same "
            "prompts in the same round; learned-shared's DFly rows replay the D-Cut worker's steps",
            f"two factors fitted, both on {FIT_ARM} alone: scale (wall time per profiled ms while both workers "
            f"step) on its figure in every scenario, solo (the factor on scale for a step taken while the other "
            f"worker idles) on its low-load phases ({low_text}); every other arm is a check",
            "profile: thread CPU time on the profiling machine; the run: wall time on its own machine, two workers, "
            "the gateway, Redis and the load generator sharing two cores: 'scale' carries both where both workers "
            "step all the time (the run's concurrency 8 and 16); where one worker steps while the other idles (S5's "
            "concurrency-2 phases: the gateway balances on a polled load up to a second old, ties broken at random, "
            "so both requests often share one worker) that worker has the machine more to itself, which 'solo' "
            "carries",
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
