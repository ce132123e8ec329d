"""`specroute sim`: the fleet simulator (bench/sim/core.py) as a what-if tool, and its checks.

    specroute sim --traffic T.jsonl.gz --profile P.json [--arms all-mtp,learned] [--fleet F.json]
                  [--policy POLICY.json] [--scale X] [--solo Y] [--seed N] [--out R.json]   # what-if
    specroute sim traffic --requests bench/results/routing-requests.jsonl.gz \\
                  --out bench/results/sim-traffic-routing.jsonl.gz                 # logged requests -> traffic
    specroute sim profile --out bench/results/sim-profile-cpu.json                 # this machine's step costs
    specroute sim calibrate --out bench/results/sim-calibration.json               # against bench routing
                  [--requests RUN-requests.jsonl.gz | --phases-from EARLIER-CALIBRATION.json]   # + per phase
    specroute sim hy3 --out bench/results/sim-hy3.json                             # against AngelSpec's Hy3 table
    specroute sim predictor --out bench/results/routing-predictor.json             # per-request prediction, replayed

A fleet file: {"workers": [{"name": "w0", "modes": ["mtp", "dfly"], "max_running": 32}],
"pools": {"mtp": [["w0", "mtp"]], "dfly": [["w0", "dfly"]]}}; a policy file is the operator's document
(`GET /admin/policy`). Without a fleet, each of `--arms` (bench routing's) is simulated.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from specroute.errors import UserError

ARMS = ("all-mtp", "all-dfly", "all-ar", "static", "learned", "learned-shared")


def _command(argv: list[str]) -> str:
    return "specroute sim " + shlex.join(argv)


def _write(doc: Any, out: Path | None) -> None:
    text = json.dumps(doc, indent=1) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None


def what_if(argv: list[str]) -> int:
    from bench.sim.core import Fleet, Gateway, TableProfile, Worker, simulate
    from bench.sim.gateway_policy import Policy, default_policy
    from bench.sim.traffic import arm_fleet, read_traffic

    ap = argparse.ArgumentParser(prog="specroute sim", description="simulate logged traffic on a fleet")
    ap.add_argument("--traffic", type=Path, required=True, help="traffic JSONL(.gz) (specroute sim traffic)")
    ap.add_argument("--profile", type=Path, required=True, help="step-cost profile JSON (specroute sim profile)")
    ap.add_argument("--arms", default=",".join(ARMS), help="bench routing arms to simulate (without --fleet)")
    ap.add_argument("--fleet", type=Path, help="fleet JSON (workers and pools) instead of the arms")
    ap.add_argument("--policy", type=Path, help="policy document JSON (default: the built-in default policy)")
    ap.add_argument("--scale", type=float, default=1.0, help="wall time per profiled ms (calibration's scale)")
    ap.add_argument("--solo", type=float, default=1.0,
                    help="factor on --scale for a step taken while the fleet's other workers idle (calibration's solo)")
    ap.add_argument("--affinity-slack", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if not a.traffic.exists():
        raise UserError(f"no traffic file {a.traffic}")
    groups = read_traffic(a.traffic)
    profile = TableProfile.from_doc(_read_json(a.profile))
    fleets: dict[str, tuple[Fleet, Policy]] = {}
    if a.fleet is not None:
        doc = _read_json(a.fleet)
        fleet = Fleet(tuple(Worker(w["name"], tuple(w["modes"]), int(w.get("max_running", 32)), w.get("narrow"))
                            for w in doc["workers"]),
                      {p: tuple((w, m) for w, m in eps) for p, eps in doc["pools"].items()})
        fleets["fleet"] = (fleet, default_policy(list(fleet.pools)))
    else:
        for arm in a.arms.split(","):
            try:
                fleets[arm] = arm_fleet(arm.strip())
            except ValueError as exc:
                raise UserError(str(exc)) from None
    policy = Policy.model_validate(_read_json(a.policy)) if a.policy is not None else None
    out: dict[str, Any] = {"meta": {"command": _command(argv),
                                    "simulated": True, "scale": a.scale, "solo": a.solo, "seed": a.seed},
                           "groups": {}}
    for g, reqs in groups.items():
        row: dict[str, Any] = {}
        for name, (fleet, pol) in fleets.items():
            gw = Gateway(policy or pol, affinity_slack=a.affinity_slack,
                         compute_bound_tokens=profile.compute_bound_tokens())
            res = simulate(reqs, fleet, profile, gw, seed=a.seed, scale=a.scale, solo=a.solo)
            row[name] = {"output_tokens_per_s": round(res.output_tokens_per_s(), 2), "pool_shares": res.pool_shares(),
                         "requests": len(res.measured)}
        out["groups"][g or "all"] = row
    _write(out, a.out)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    sub = argv[0] if argv and not argv[0].startswith("-") else ""
    rest = argv[1:] if sub else argv
    if sub == "":
        return what_if(rest)
    if sub == "traffic":
        ap = argparse.ArgumentParser(prog="specroute sim traffic")
        ap.add_argument("--requests", type=Path, required=True, help="a bench routing run's <name>-requests.jsonl.gz")
        ap.add_argument("--data", type=Path, default=Path("../shared/data"))
        ap.add_argument("--model", type=Path, default=Path("models/demo"))
        ap.add_argument("--warmup", type=int, default=40)
        ap.add_argument("--out", type=Path, required=True)
        a = ap.parse_args(rest)
        from bench.sim.traffic import from_routing_log, prompt_table, read_log, write_traffic

        rows = read_log(a.requests)
        prompts = prompt_table({r["prompt_id"] for r in rows}, a.data, a.model)
        missing = {r["prompt_id"] for r in rows} - set(prompts)
        if missing:
            raise UserError(f"{len(missing)} prompts of the log are not in {a.data} (e.g. {sorted(missing)[0]})")
        traffic = from_routing_log(rows, prompts, a.warmup)
        write_traffic(a.out, {f"{s}/{r}": v for (s, r), v in sorted(traffic.items())})
        print(f"wrote {a.out}: {sum(len(v) for v in traffic.values())} requests in {len(traffic)} groups")
        return 0
    if sub == "profile":
        ap = argparse.ArgumentParser(prog="specroute sim profile")
        ap.add_argument("--model", type=Path, default=Path("models/demo"))
        ap.add_argument("--reps", type=int, default=5)
        ap.add_argument("--out", type=Path, default=Path("bench/results/sim-profile-cpu.json"))
        a = ap.parse_args(rest)
        from bench.sim.profile_cpu import measure

        doc = measure(a.model, reps=a.reps)
        doc["command"] = _command(["profile", *rest])
        _write(doc, a.out)
        return 0
    if sub == "calibrate":
        ap = argparse.ArgumentParser(prog="specroute sim calibrate")
        ap.add_argument("--run", type=Path, default=Path("bench/results/routing.json"))
        ap.add_argument("--traffic", type=Path, default=Path("bench/results/sim-traffic-routing.jsonl.gz"))
        ap.add_argument("--profile", type=Path, default=Path("bench/results/sim-profile-cpu.json"))
        ap.add_argument("--out", type=Path, default=Path("bench/results/sim-calibration.json"))
        ap.add_argument("--run-cpu", default="", help="the run's CPU where its meta lacks one")
        ap.add_argument("--requests", type=Path, help="the run's request log: per-phase figures too")
        ap.add_argument("--phases-from", type=Path,
                        help="an earlier calibration of the same run: its measured per-phase figures (when the "
                             "request log is not kept)")
        a = ap.parse_args(rest)
        from bench.sim.calibrate import calibrate, measured_phases
        from bench.sim.traffic import read_log, read_traffic

        groups = read_traffic(a.traffic)
        traffic = {(g.split("/")[0], int(g.split("/")[1])): v for g, v in groups.items()}
        if a.requests is not None and not a.requests.exists():
            raise UserError(f"no request log {a.requests}")
        log = read_log(a.requests) if a.requests is not None else None
        phases = measured_phases(_read_json(a.phases_from)) if a.phases_from is not None else None
        doc = calibrate(traffic, _read_json(a.run), _read_json(a.profile), command=_command(argv), log=log,
                        phases=phases)
        doc["meta"]["inputs"] = {"run": str(a.run), "traffic": str(a.traffic), "profile": str(a.profile),
                                 **({"phases_from": str(a.phases_from)} if a.phases_from is not None else {})}
        doc["meta"]["run_cpu"] = doc["meta"]["run_cpu"] or a.run_cpu
        _write(doc, a.out)
        s = doc["summary"]
        print(f"{s['within_10pct']}/{s['cells']} arm x scenario within 10% (max |error| {s['max_abs_relative_error']})")
        return 0
    if sub == "predictor":
        ap = argparse.ArgumentParser(prog="specroute sim predictor")
        ap.add_argument("--traffic", type=Path, default=Path("bench/results/sim-traffic-routing.jsonl.gz"))
        ap.add_argument("--profile", type=Path, default=Path("bench/results/sim-profile-cpu.json"))
        ap.add_argument("--run", type=Path, default=Path("bench/results/routing.json"),
                        help="the bench routing run the traffic came from (its seed and sizes regenerate the prompts)")
        ap.add_argument("--data", type=Path, default=Path("../shared/data"))
        ap.add_argument("--ridge", type=float, default=30.0)
        ap.add_argument("--prior-weight", type=float, default=30.0)
        ap.add_argument("--seed", type=int, default=0)
        ap.add_argument("--out", type=Path, default=Path("bench/results/routing-predictor.json"))
        a = ap.parse_args(rest)
        from bench.sim.core import TableProfile
        from bench.sim.predictor import run_predictor
        from bench.sim.traffic import read_traffic

        doc = run_predictor(read_traffic(a.traffic), TableProfile.from_doc(_read_json(a.profile)),
                            _read_json(a.run)["meta"], a.data, ridge=a.ridge, prior_weight=a.prior_weight, seed=a.seed)
        doc["meta"] = {"command": _command(argv), "replayed": True, "traffic": str(a.traffic),
                       "profile": str(a.profile), "run": str(a.run), **doc["meta"]}
        _write(doc, a.out)
        for name, r in doc["policies"].items():
            p = r["summary"]["predicted"]
            print(f"{name} policy: predicted captures {p['captured_mean']} of the request oracle's gain on average "
                  f"(worst scenario {p['captured_min']}), worst paired regret {p['paired_regret_max']}")
        return 0
    if sub == "hy3":
        ap = argparse.ArgumentParser(prog="specroute sim hy3")
        ap.add_argument("--out", type=Path, default=Path("bench/results/sim-hy3.json"))
        ap.add_argument("--seed", type=int, default=0)
        ap.add_argument("--no-routing", action="store_true", help="the table check only")
        a = ap.parse_args(rest)
        from bench.sim.hy3 import run

        doc = run(_command(argv), a.seed, routing=not a.no_routing)
        _write(doc, a.out)
        print(f"winners {doc['winners_matched']}/{doc['cells']}, MTP cells {doc['mtp_cells_matched']}/{doc['mtp_cells']}, "
              f"speedups within 10% {doc['speedups_within_10pct']}/{doc['speedup_entries']}")
        for load, r in doc.get("routing", {}).get("loads", {}).items():
            gains = {s: v["vs_best_static"]["learned"] for s, v in r["scenarios"].items()}
            print(f"simulated learned vs best static fleet at {load}: "
                  + ", ".join(f"{s} {g:+.1%}" for s, g in gains.items()))
        return 0
    raise UserError(f"unknown sim command {sub!r} (traffic, profile, calibrate, hy3, predictor, or options for a "
                    "what-if run)")
