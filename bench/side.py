"""`specroute bench side`: our engines and vLLM's on one model, side by side and paired.

Every arm is loaded first and warmed up; then, for each of `--rounds` rounds and each concurrency, every
arm serves the same `--requests` held-out prompts (chat / code / math round-robin, chat-templated, the
same token ids for every arm) with the same `--max-tokens` at temperature 0, closed loop, one arm at a
time in an order rotated each round (so no arm always runs first or after the same neighbour). A round
is a paired sample: the report gives each arm's tokens/s per round, its median and spread, and the
per-round ratio of our AR to vLLM's AR (the issue's acceptance: ours at least matches vLLM's at c=1).

Arms (`--arms`, comma list):
- `ar`, `mtp`, `dfly`, ... our engines (`engines.drafters.registry.engine_kinds`), in-process batchers;
  `KIND+dcut` with D-Cut over this machine's cost profile (measured at load unless cached next to the model);
- `vllm:METHOD[=DRAFTER]` vLLM (`bench.engine_vllm.VllmRunner`, the worker's backend): `vllm:none`
  plain decoding, `vllm:ngram`, `vllm:draft_model` (DRAFTER: a draft model with the target's tokenizer;
  default the target itself: every draft accepted, so the row shows what the method costs), `vllm:eagle`
  (DRAFTER: an EAGLE checkpoint; default our MTP head exported by `engines.vllm_export`), `vllm:mtp`
  (DRAFTER: a separate MTP checkpoint).
An arm vLLM refuses to load is reported with its error (`failed`), not dropped.

Every output is checked whole against our AR's output for the same prompt (`engines.lossless`).
Threads: `--threads` torch threads for our batchers, and vLLM's CPU worker gets the same through
OMP_NUM_THREADS (one compute thread each; vLLM's scheduler and detokenizer run in their own processes).

    specroute bench side --model models/smollm2 --arms ar,mtp,dfly,vllm:none,vllm:ngram,vllm:draft_model,vllm:eagle \\
        --concurrency 1,4 --requests 8 --rounds 3 --max-tokens 64 --threads 1 \\
        --out bench/results/smollm2/engine-vllm.json                      # in .venv-vllm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.engine import (
    EngineRow,
    count_lossless_failures,
    counters,
    mixed_prompts,
    parse_engine,
    parse_list,
    run_closed_loop,
    summarize,
)
from specroute.errors import UserError

VLLM_K = 3
SETTLE_S = 1.5   # between arms: vLLM's idle worker stops busy-polling 1 s after its last step


class SideRow(EngineRow):
    arm: str
    rounds_tokens_per_s: list[float]
    tokens_per_s_median: float
    tokens_per_s_min: float
    tokens_per_s_max: float


class SideReport(BaseModel):
    model: str
    threads: int
    max_tokens: int
    requests: int
    rounds: int                      # rounds finished (the file is rewritten after each)
    prompts: int
    arms: list[str]
    rows: list[SideRow]
    failed: dict[str, str] = {}
    # per concurrency: our AR tokens/s over vLLM's AR tokens/s in the same round (median, min, max, rounds)
    ar_vs_vllm: dict[str, dict[str, Any]] = {}
    notes: list[str] = []


def parse_arm(spec: str) -> tuple[str, str | None, str | None]:
    """`ar` -> ("ar", None, None); `dfly+dcut` -> ("dfly+dcut", None, None); `vllm:draft_model=/m` ->
    ("vllm", "draft_model", "/m")."""
    from engines.drafters.registry import engine_kinds
    from engines.vllm_adapter import VLLM_METHODS

    kind, _, rest = spec.partition(":")
    if kind != "vllm":
        if rest or kind.partition("+")[0] not in engine_kinds():
            raise UserError(f"unknown arm {spec!r} (ours: {', '.join(engine_kinds())}, optionally +dcut; "
                            "vLLM: vllm:METHOD[=DRAFTER])")
        parse_engine(kind)
        return kind, None, None
    method, _, drafter = rest.partition("=")
    if method not in VLLM_METHODS or method == "dflash":
        raise UserError(f"vllm arm {spec!r}: method must be one of none, ngram, draft_model, eagle, mtp")
    return "vllm", method, drafter or None


def paired_ratio(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """Round-by-round ratio ours / theirs -> {median, min, max, rounds} (rounds with a zero skipped)."""
    r = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
    if not r:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "rounds": []}
    return {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3),
            "rounds": [round(x, 3) for x in r]}


def rotated(items: list[Any], k: int) -> list[Any]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


@dataclass
class Arm:
    name: str
    runner: Any                      # a Batcher or a VllmRunner (both `submit(request, sink)`)
    vllm: bool
    load_s: float
    target: Any = None               # our arms: the target model (the AR arm's checks every output)
    reqs: dict[int, list] = field(default_factory=dict)          # concurrency -> requests over all rounds
    walls: dict[int, list[float]] = field(default_factory=dict)  # concurrency -> wall time per round
    rates: dict[int, list[float]] = field(default_factory=dict)  # concurrency -> tokens/s per round
    drafted_steps: dict[int, float] = field(default_factory=dict)  # concurrency -> steps that verified drafts
    accepted: dict[int, float] = field(default_factory=dict)
    kept: dict[int, list[float]] = field(default_factory=dict)   # draft_steps, kept sum, decode steps


def load_arm(spec: str, model_dir: Path, cmax: int, threads: int, max_len: int, export_dir: Path) -> Arm:
    kind, method, drafter = parse_arm(spec)
    t0 = time.perf_counter()
    if kind == "vllm":
        from bench.engine_vllm import VllmRunner

        if method == "draft_model" and not drafter:
            drafter = str(model_dir)
        if method == "eagle" and not drafter:
            from engines.vllm_export import export_vllm

            drafter = str(export_vllm(model_dir, "mtp", export_dir / "mtp"))
        runner = VllmRunner(model_dir, method, VLLM_K if method != "none" else None, cmax, threads, drafter, max_len)
        return Arm(spec, runner, True, time.perf_counter() - t0)
    from engines.factory import load_engine, make_batcher
    from engines.requests import BatcherConfig

    kind, dcut = parse_engine(kind)
    engine = load_engine(kind, model_dir)
    cfg = BatcherConfig(max_running=cmax, max_waiting=4 * cmax + 8, max_len=min(max_len, engine.max_context))
    batcher = make_batcher(engine, cfg, dcut=dcut, threads=threads).start()
    return Arm(spec, batcher, False, time.perf_counter() - t0, engine.target)


def arm_counters(arm: Arm) -> dict[str, float]:
    if arm.vllm:
        c = arm.runner.counters()
        return {"rows_drafted": c["rounds"], "accepted_total": c["accepted"], "draft_steps": 0.0,
                "kept_fraction_sum": 0.0, "decode_steps": 0.0}
    return counters(arm.runner)


def measure(arm: Arm, prompts: list, c: int, n: int, max_tokens: int) -> None:
    before = arm_counters(arm)
    reqs, wall = run_closed_loop(arm.runner, prompts, c, n, max_tokens)
    d = {k: v - before[k] for k, v in arm_counters(arm).items()}
    arm.reqs.setdefault(c, []).extend(reqs)
    arm.walls.setdefault(c, []).append(wall)
    arm.rates.setdefault(c, []).append(sum(len(r.tokens) for r in reqs) / wall if wall else 0.0)
    arm.drafted_steps[c] = arm.drafted_steps.get(c, 0.0) + d["rows_drafted"]
    arm.accepted[c] = arm.accepted.get(c, 0.0) + d["accepted_total"]
    k = arm.kept.setdefault(c, [0.0, 0.0, 0.0])
    for i, key in enumerate(("draft_steps", "kept_fraction_sum", "decode_steps")):
        k[i] += d[key]


def row_of(arm: Arm, c: int, reference: dict[str, list[int]], target: Any) -> SideRow:
    reqs, rates = arm.reqs[c], arm.rates[c]
    rounds, accepted = arm.drafted_steps[c], arm.accepted[c]
    mal = 1.0 + accepted / rounds if rounds else 1.0
    draft_steps, kept_sum, decode_steps = arm.kept[c]
    if arm.vllm:
        steps = sum(r.stats.acceptance.steps for r in reqs if r.stats is not None)
        frac = rounds / steps if steps else 0.0
        kept = 1.0
    else:
        frac = draft_steps / decode_steps if decode_steps and arm.name != "ar" else 0.0
        kept = kept_sum / draft_steps if draft_steps else 1.0
    base = summarize(arm.name.partition(":")[0], False, c, reqs, sum(arm.walls[c]), kept, mal, frac)
    row = SideRow(**base.model_dump(), arm=arm.name, rounds_tokens_per_s=[round(x, 2) for x in rates],
                  tokens_per_s_median=round(statistics.median(rates), 2), tokens_per_s_min=round(min(rates), 2),
                  tokens_per_s_max=round(max(rates), 2))
    if reference and target is not None:
        row.lossless_failures = count_lossless_failures(target, reqs, reference)
    return row


def write_report(report: SideReport, arms: list[Arm], concurrencies: list[int], out: Path) -> None:
    """Rows, the lossless checks against our AR's outputs and the AR ratio over the rounds so far -> `out`."""
    ar = next(a for a in arms if a.name == "ar")
    reference: dict[str, list[int]] = {}
    for req in ar.reqs[concurrencies[0]]:
        reference.setdefault(req.prompt_id, req.tokens)
    report.rows = [row_of(a, c, reference, ar.target) for a in arms for c in concurrencies]
    vllm_ar = next((a for a in arms if a.name == "vllm:none"), None)
    if vllm_ar is not None:
        report.ar_vs_vllm = {str(c): paired_ratio(ar.rates[c], vllm_ar.rates[c]) for c in concurrencies}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.model_dump(), indent=1) + "\n")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench side", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--arms", default="ar,mtp,dfly,vllm:none,vllm:ngram,vllm:draft_model,vllm:eagle")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=8, help="requests per arm, concurrency and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="compute threads per arm (torch / vLLM's OMP)")
    ap.add_argument("--out", default="bench/results/smollm2/engine-vllm.json", help="the JSON report")
    args = ap.parse_args(argv)
    specs = parse_list(args.arms)
    for s in specs:
        parse_arm(s)
    if "ar" not in specs:
        raise UserError("--arms needs ar: our AR is the reference every output is checked against")
    concurrencies = sorted({int(c) for c in parse_list(args.concurrency)})
    if not concurrencies or min(concurrencies) < 1 or args.rounds < 1 or args.requests < 1:
        raise UserError("--concurrency, --rounds and --requests need positive integers")
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise UserError(f"no model in {model_dir}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)   # vLLM's CPU worker reads it; set before any arm loads
    import torch

    torch.set_num_threads(args.threads)
    from engines.tokenizer import Tokenizer

    cmax = max(concurrencies)
    prompts = mixed_prompts(Tokenizer.load(model_dir), max(args.requests, 3), args.max_prompt_tokens)
    max_len = args.max_prompt_tokens + args.max_tokens + 64
    arms: list[Arm] = []
    failed: dict[str, str] = {}
    notes = [f"threads: torch {args.threads} for ours; vLLM OMP_NUM_THREADS={args.threads}, its CPU worker pinned by "
             f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')} (auto: one core, "
             "the other reserved), its scheduler and detokenizer in their own processes"]
    with tempfile.TemporaryDirectory(prefix="specroute-side-") as tmp:
        try:
            for spec in specs:
                try:
                    arm = load_arm(spec, model_dir, cmax, args.threads, max_len, Path(tmp))
                except Exception as exc:   # an arm vLLM refuses: recorded with its reason
                    if not spec.startswith("vllm:"):
                        raise
                    failed[spec] = f"{type(exc).__name__}: {exc}"[:2000]
                    print(f"bench side: {spec} failed to load: {failed[spec][:300]}", file=sys.stderr, flush=True)
                    continue
                run_closed_loop(arm.runner, prompts, 1, 1, 8)   # warm-up (excluded)
                run_closed_loop(arm.runner, prompts, cmax, cmax, 8)
                time.sleep(SETTLE_S)
                arms.append(arm)
                if arm.vllm:
                    notes.append(f"{spec}: {arm.runner.label}, ready in {arm.load_s:.1f}s, "
                                 f"engine args {arm.runner.backend.engine_kwargs}")
                print(f"bench side: {spec} ready in {arm.load_s:.1f}s", file=sys.stderr, flush=True)
            for r in range(args.rounds):
                for c in concurrencies:
                    for arm in rotated(arms, r):
                        measure(arm, prompts, c, args.requests, args.max_tokens)
                        time.sleep(SETTLE_S)
                        print(f"bench side: round {r + 1} c={c} {arm.name}: {arm.rates[c][-1]:.1f} tok/s",
                              file=sys.stderr, flush=True)
                # after every round: a run cut short still leaves the rounds it finished
                report = SideReport(model=str(model_dir), threads=args.threads, max_tokens=args.max_tokens,
                                    requests=args.requests, rounds=r + 1, prompts=len(prompts), arms=specs,
                                    rows=[], failed=failed, notes=notes)
                write_report(report, arms, concurrencies, Path(args.out))
        finally:
            for arm in arms:
                arm.runner.stop()
    for row in report.rows:
        print(f"bench side: {row.arm:<18} c={row.concurrency}: median {row.tokens_per_s_median:6.1f} tok/s "
              f"[{row.tokens_per_s_min:.1f}, {row.tokens_per_s_max:.1f}], MAL {row.mean_accepted_length:.2f}, "
              f"lossless failures {row.lossless_failures}")
    for c, v in report.ar_vs_vllm.items():
        print(f"bench side: our AR / vLLM AR at c={c}: median {v['median']} [{v['min']}, {v['max']}]")
    print(f"bench side: wrote {args.out}")
    return 0
