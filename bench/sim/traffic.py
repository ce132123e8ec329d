"""Simulator traffic from logged requests, and the fleets of `bench routing`'s arms.

A traffic file is JSON lines, one request each (`request_row` / `read_traffic`): its phase and
concurrency, the classifier's probabilities and uncertainty, temperature, context buckets, prompt
tokens, and `replay`: per mode, how that mode served the prompt (tokens, steps, drafts, accepted,
drafted steps). `from_routing_log` builds one per (scenario, round) of a `bench routing` run from its
`<name>-requests.jsonl.gz`: each request's replay comes from the run's single-mode fleets (all-MTP,
all-DFly + D-Cut, all-AR), which served the same prompts in the same round; prompts are read back
by id from the held-out data to count their tokens and classify them as the gateway did.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.sim.core import Fleet, Replay, Request, Worker
from bench.sim.gateway_policy import Policy, RequestContext, default_policy
from specroute.contracts.context import temperature_bucket

# the single-mode fleet of each mode in `bench routing` (bench/routing_system.py `ARMS`)
MODE_ARMS = {"mtp": "all-mtp", "dfly": "all-dfly", "ar": "all-ar"}


def arm_fleet(arm: str) -> tuple[Fleet, Policy]:
    """The fleet and policy of one `bench routing` arm: two workers, the built-in default policy (the
    classifier-static arm with learning off)."""
    single = {"all-mtp": "mtp", "all-dfly": "dfly", "all-ar": "ar"}
    if arm in single:
        m = single[arm]
        ws = (Worker(f"{m}#0", (m,), dcut=m == "dfly"), Worker(f"{m}#1", (m,), dcut=m == "dfly"))
        return Fleet(ws, {m: tuple((w.name, m) for w in ws)}), default_policy([m])
    if arm in ("static", "learned"):
        ws = (Worker("mtp#0", ("mtp",)), Worker("dfly#0", ("dfly",), dcut=True))
        policy = default_policy(["mtp", "dfly"])
        if arm == "static":
            policy = policy.model_copy(update={"learning": policy.learning.model_copy(update={"enabled": False})})
        return Fleet(ws, {"mtp": (("mtp#0", "mtp"),), "dfly": (("dfly#0", "dfly"),)}), policy
    if arm in ("learned-shared", "learned-shared-least"):
        ws = (Worker("multi#0", ("mtp", "dfly"), narrow="mtp"), Worker("multi#1", ("mtp", "dfly"), narrow="mtp"))
        pools = {m: tuple((w.name, m) for w in ws) for m in ("mtp", "dfly")}
        return Fleet(ws, pools), default_policy(["mtp", "dfly"])
    raise ValueError(f"unknown arm {arm!r}")


def replay_of(row: Mapping[str, Any]) -> Replay:
    """How one logged request was served (a refused one, `ok` false, emitted nothing: `tokens` 0)."""
    if not row.get("ok", True):
        return Replay(0, 0)
    steps = int(row.get("steps") or 0)
    plain = int((row.get("drafter_steps") or {}).get("plain", 0))
    return Replay(int(row["completion_tokens"]), steps, int(row.get("drafted") or 0), int(row.get("accepted") or 0),
                  max(0, steps - plain) if row.get("drafted") else 0)


def request_row(req: Request) -> dict[str, Any]:
    ctx = req.context
    return {"index": req.index, "phase": req.phase, "concurrency": req.concurrency,
            "probabilities": dict(req.probabilities), "uncertainty": req.uncertainty,
            "temperature": req.temperature, "prompt_tokens": req.prompt_tokens, "measured": req.measured,
            "context": None if ctx is None else {"script": ctx.script, "temperature": ctx.temperature,
                                                 "length": ctx.length},
            "replay": {m: vars(r) for m, r in req.replay.items()}}


def parse_request(d: Mapping[str, Any]) -> Request:
    c = d.get("context")
    return Request(int(d["index"]), int(d["phase"]), int(d["concurrency"]), dict(d["probabilities"]),
                   float(d["uncertainty"]), float(d["temperature"]), int(d["prompt_tokens"]),
                   {m: Replay(**r) for m, r in d["replay"].items()},
                   RequestContext("", c["script"], c["temperature"], c["length"]) if c else None,
                   bool(d.get("measured", True)))


def write_traffic(path: Path, groups: Mapping[str, Sequence[Request]]) -> None:
    """One line per request; `group` names the run it belongs to (each group is simulated on its own)."""
    with (gzip.open(path, "wt") if path.suffix == ".gz" else path.open("w")) as f:
        for g, reqs in groups.items():
            for r in reqs:
                f.write(json.dumps({"group": g, **request_row(r)}) + "\n")


def read_traffic(path: Path) -> dict[str, list[Request]]:
    """group -> its requests, in file order (a file without groups is one group, "")."""
    out: dict[str, list[Request]] = {}
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.setdefault(str(d.get("group", "")), []).append(parse_request(d))
    return out


def read_log(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def from_routing_log(rows: Sequence[Mapping[str, Any]], prompts: Mapping[str, Any], warmup: int
                     ) -> dict[tuple[str, int], list[Request]]:
    """(scenario, round) -> its traffic: every request the single-mode fleets served, replayed per mode,
    with the first `warmup` requests of the first phase replayed first, unmeasured (the benchmark's
    warm-up uses other prompts of that phase: its learning starts warm). `prompts[id]` =
    (prompt tokens, probabilities, uncertainty, context) of each prompt."""
    by: dict[tuple[str, int, int], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        mode = next((m for m, a in MODE_ARMS.items() if a == r["arm"]), None)
        if mode is not None:
            by.setdefault((str(r["cell"]).split("@")[0], int(r["round"]), int(r["index"])), {})[mode] = r
    out: dict[tuple[str, int], list[Request]] = {}
    for (scen, rnd, _i), modes in sorted(by.items()):
        if len(modes) < len(MODE_ARMS):
            continue
        r = next(iter(modes.values()))
        tokens, probs, unc, ctx = prompts[r["prompt_id"]]
        out.setdefault((scen, rnd), []).append(Request(
            int(r["index"]), int(r["phase"]), int(r["concurrency"]), probs, unc, float(r["temperature"]), tokens,
            {m: replay_of(x) for m, x in sorted(modes.items())},
            RequestContext("", ctx.script, temperature_bucket(float(r["temperature"])), ctx.length)))
    for key, reqs in out.items():
        first = [r for r in reqs if r.phase == reqs[0].phase][:warmup]
        out[key] = [Request(-1 - i, r.phase, r.concurrency, r.probabilities, r.uncertainty, r.temperature,
                            r.prompt_tokens, r.replay, r.context, measured=False)
                    for i, r in enumerate(first)] + reqs
    return out


def prompt_table(ids: Iterable[str], data_dir: Path, model: Path) -> dict[str, Any]:
    """id -> (prompt tokens, probabilities, uncertainty, context) for the held-out prompts named."""
    from bench.routing_trace import read_prompts
    from classifier import classify
    from engines.tokenizer import Tokenizer
    from specroute.contracts.context import request_context
    from specroute.contracts.limits import text_bytes

    want = set(ids)
    tok = Tokenizer.load(model)
    out: dict[str, Any] = {}
    for p in read_prompts(data_dir):
        if p.id in want:
            msgs = [{"role": "user", "content": p.text}]
            _label, probs, unc = classify(msgs)
            out[p.id] = (len(tok.encode_chat(msgs)), dict(probs), float(unc),
                         request_context([p.text], 0.0, text_bytes([p.text])))
    return out
