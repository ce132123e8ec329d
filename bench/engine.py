"""`specroute bench engine`: serving throughput and latency of the batcher, per engine and concurrency.

For each engine configuration (`ar`, `mtp`, `dflash`, `dfly`, `dfly+dcut` by default) and each
concurrency c in {1, 4, 8, 16, 32}, c closed-loop clients send requests from a fixed mixed-domain set
of held-out prompts (chat / code / math round-robin, chat-templated) through an in-process `Batcher`
(no gRPC) at temperature 0. Recorded per row: output tokens/s (all tokens / wall time), TTFT and
inter-token latency percentiles (ITL: each stream event's gap split evenly over its tokens), mean
accepted length (vLLM's convention: 1 + accepted drafts / rows verified with drafts) and kept ratio (mean over
decode steps of the fraction of drafted positions D-Cut sent to verification; 1.0 without D-Cut). When `ar` is part of the run, every output is checked against AR's
output for the same prompt (`engines.lossless.check_lossless`; `lossless_failures` counts the rest).

Writes `engine.json` and `engine.png` into `--out`. `--memory N` instead runs N requests through one
worker-sized batcher and reports resident memory after 100 and after N requests (`engine_memory.json`).

    specroute bench engine --engines ar --out bench/results/
    specroute bench engine --engines "ar mtp dflash dfly dfly+dcut" --concurrency 1,4,8,16,32 --out bench/results/
    specroute bench engine --engines vllm,ar --concurrency 1,4 --threads 1 --out /tmp/b   # needs vLLM (.venv-vllm)

`vllm` is vLLM's engine with its own speculation (`--vllm-method`, ngram by default; bench/engine_vllm.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from engines.drafters.registry import engine_kinds
from specroute.errors import UserError

DEFAULT_ENGINES = ",".join((*engine_kinds(), "dfly+dcut"))
DOMAINS = ("chat", "code", "math")


class EngineRow(BaseModel):
    engine: str
    dcut: bool
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    mean_accepted_length: float
    kept_ratio: float
    drafted_step_fraction: float = 1.0   # decode steps that ran the drafter (D-Cut may skip it)
    lossless_failures: int | None = None


class EngineReport(BaseModel):
    model: str
    threads: int
    max_tokens: int
    prompts: int
    rows: list[EngineRow]
    notes: list[str] = []


def parse_list(text: str) -> list[str]:
    return [t for t in re.split(r"[,\s]+", text.strip()) if t]


def parse_engine(spec: str) -> tuple[str, bool]:
    kind, _, extra = spec.partition("+")
    if (kind not in engine_kinds() and kind != "vllm") or extra not in ("", "dcut"):
        raise UserError(f"unknown engine {spec!r} (expected {', '.join(engine_kinds())}, optionally +dcut, "
                        "or vllm)")
    if extra == "dcut" and kind in ("ar", "vllm"):
        raise UserError(f"{kind}+dcut makes no sense: D-Cut prunes our drafters' drafts")
    return kind, extra == "dcut"


def mixed_prompts(tok, n: int, max_prompt_tokens: int) -> list[tuple[str, str, list[int]]]:
    """n held-out prompts, domains round-robin, deterministic order: (id, domain, token ids)."""
    from engines.training.data import load_prompts

    by_domain: dict[str, list] = {d: [] for d in DOMAINS}
    for p in load_prompts("heldout"):
        if p.domain in by_domain:
            by_domain[p.domain].append(p)
    out: list[tuple[str, str, list[int]]] = []
    idx = dict.fromkeys(DOMAINS, 0)
    while len(out) < n and any(idx[d] < len(by_domain[d]) for d in DOMAINS):
        for d in DOMAINS:
            while idx[d] < len(by_domain[d]) and len(out) < n:
                p = by_domain[d][idx[d]]
                idx[d] += 1
                ids = tok.encode_chat([{"role": "user", "content": p.prompt}])
                if len(ids) <= max_prompt_tokens:
                    out.append((p.id, d, ids))
                    break
    if not out:
        raise UserError("no held-out prompts found: set SPECROUTE_DATA_DIR to a data folder with prompts/*.jsonl "
                        "or place one at ../shared/data beside the repository")
    return out


@dataclass
class _Req:
    prompt_id: str
    prompt: list[int]
    submitted: float = 0.0
    first: float = 0.0
    last: float = 0.0
    tokens: list[int] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    stats: object = None
    finish: str = ""


def run_closed_loop(batcher, prompts, concurrency: int, num_requests: int, max_tokens: int,
                    timeout_s: float = 1800.0) -> tuple[list[_Req], float]:
    """`concurrency` clients, each sending its next request when the previous one finishes."""
    from engines.requests import GenRequest
    from engines.sampling import SamplingParams

    lock = threading.Lock()
    done = threading.Event()
    reqs: list[_Req] = []
    state = {"next": 0, "finished": 0}

    def submit_next() -> None:
        with lock:
            i = state["next"]
            if i >= num_requests:
                return
            state["next"] = i + 1
            pid, _, ids = prompts[i % len(prompts)]
            r = _Req(pid, ids)
            reqs.append(r)
        r.submitted = time.perf_counter()
        batcher.submit(GenRequest(ids, SamplingParams(), max_tokens=max_tokens, request_id=pid), make_sink(r))

    def make_sink(r: _Req):
        def sink(ev) -> None:
            n = len(ev.token_ids)
            if n:
                if not r.first:
                    r.first = ev.t
                else:
                    r.itl.extend([(ev.t - r.last) / n] * n)
                r.last = ev.t
                r.tokens.extend(ev.token_ids)
            if ev.finish_reason:
                r.stats, r.finish = ev.stats, ev.finish_reason
                with lock:
                    state["finished"] += 1
                    all_done = state["finished"] >= num_requests
                if all_done:
                    done.set()
                else:
                    submit_next()
        return sink

    t0 = time.perf_counter()
    for _ in range(min(concurrency, num_requests)):
        submit_next()
    if not done.wait(timeout_s):
        raise RuntimeError(f"benchmark run did not finish within {timeout_s:.0f}s")
    return reqs, time.perf_counter() - t0


def summarize(kind: str, dcut: bool, c: int, reqs: list[_Req], wall: float, kept: float, mal: float,
              drafted_frac: float) -> EngineRow:
    toks = sum(len(r.tokens) for r in reqs)
    ttft = [1000.0 * (r.first - r.submitted) for r in reqs if r.first]
    itl = [1000.0 * x for r in reqs for x in r.itl]

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) if xs else 0.0

    return EngineRow(engine=kind, dcut=dcut, concurrency=c, requests=len(reqs), output_tokens=toks,
                     wall_s=round(wall, 3), output_tokens_per_s=round(toks / wall, 2) if wall else 0.0,
                     ttft_p50_ms=round(pct(ttft, 50), 2), ttft_p99_ms=round(pct(ttft, 99), 2),
                     itl_p50_ms=round(pct(itl, 50), 3), itl_p99_ms=round(pct(itl, 99), 3),
                     mean_accepted_length=round(mal, 3), kept_ratio=round(min(kept, 1.0), 3),
                     drafted_step_fraction=round(drafted_frac, 3))


def plot(report: EngineReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    labels = sorted({(r.engine, r.dcut) for r in report.rows}, key=lambda x: (x[0] != "ar", x))
    for eng, dc in labels:
        rows = sorted((r for r in report.rows if (r.engine, r.dcut) == (eng, dc)), key=lambda r: r.concurrency)
        name = eng + (" +dcut" if dc else "")
        cs = [r.concurrency for r in rows]
        axes[0].plot(cs, [r.output_tokens_per_s for r in rows], marker="o", label=name)
        axes[1].plot(cs, [r.ttft_p50_ms for r in rows], marker="o", label=name)
        axes[2].plot(cs, [r.mean_accepted_length for r in rows], marker="o", label=name)
    for ax, title in zip(axes, ("output tokens/s", "TTFT p50 (ms)", "mean accepted length"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"specroute engine benchmark ({report.model}, {report.threads} threads, "
                 f"{report.max_tokens} max tokens, T=0)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench engine", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--engines", default=DEFAULT_ENGINES, help=f"comma/space list: {DEFAULT_ENGINES.replace(',', ' ')}")
    ap.add_argument("--concurrency", default="1,4,8,16,32")
    ap.add_argument("--requests", type=int, default=0, help="requests per run (default: max(2c, 8))")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--profile-dir", default=None, help="D-Cut profile cache dir (default: next to the model)")
    ap.add_argument("--memory", type=int, default=0, help="memory check: run N requests (e.g. 1000)")
    ap.add_argument("--vllm-method", default=None, help="vllm row: its speculation (default ngram; none for plain)")
    ap.add_argument("--vllm-k", type=int, default=None, help="vllm row: draft tokens per step (default 3)")
    ap.add_argument("--out", default="bench/results/")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise UserError(f"no model in {model_dir} (train it first: specroute train target --preset demo)")
    concurrencies = sorted({int(c) for c in parse_list(args.concurrency)})
    if not concurrencies or min(concurrencies) < 1:
        raise UserError("--concurrency needs positive integers")
    specs = [parse_engine(s) for s in parse_list(args.engines)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from engines.factory import load_engine, make_batcher
    from engines.requests import BatcherConfig

    if args.memory:
        return memory_check(args, model_dir, specs[0], out)

    cmax = max(concurrencies)
    explicit = args.engines != DEFAULT_ENGINES
    rows: list[EngineRow] = []
    notes: list[str] = []
    reference: dict[str, list[int]] = {}
    kinds = sorted(dict.fromkeys(k for k, _ in specs), key=lambda k: k != "ar")   # AR first: the reference
    prompts = None
    ar_target = None
    for kind in kinds:
        if kind == "vllm":
            from bench.engine_vllm import run_vllm
            from engines.tokenizer import Tokenizer

            if prompts is None:
                prompts = mixed_prompts(Tokenizer.load(model_dir), max(64, 2 * cmax), args.max_prompt_tokens)
            rows += run_vllm(args, model_dir, prompts, concurrencies, reference, ar_target, notes)
            continue
        if kind != "ar" and not (model_dir / "drafters" / kind / "config.json").is_file():
            msg = f"no {kind} drafter in {model_dir}/drafters/{kind}"
            if explicit:
                raise UserError(msg + " (train it first)")
            notes.append(msg + ": skipped")
            print(f"bench engine: {msg}: skipped", file=sys.stderr)
            continue
        engine = load_engine(kind, model_dir, block_size=args.block_size)
        if prompts is None:
            prompts = mixed_prompts(engine.tokenizer, max(64, 2 * cmax), args.max_prompt_tokens)
        for k2, dcut in specs:
            if k2 != kind:
                continue
            cfg = BatcherConfig(max_running=cmax, max_waiting=4 * cmax + 8, max_len=engine.max_context)
            t_prof = time.perf_counter()
            batcher = make_batcher(engine, cfg, dcut=dcut, threads=threads, profile_dir=args.profile_dir).start()
            if dcut:
                notes.append(f"{kind}+dcut: profile ready in {time.perf_counter() - t_prof:.1f}s")
            run_closed_loop(batcher, prompts, 1, 1, 8)   # warm-up
            for c in concurrencies:
                n = args.requests or max(2 * c, 8)
                before = counters(batcher)
                reqs, wall = run_closed_loop(batcher, prompts, c, n, args.max_tokens)
                d = {key: v - before[key] for key, v in counters(batcher).items()}
                kept = d["kept_fraction_sum"] / d["draft_steps"] if d["draft_steps"] else 1.0
                mal = 1.0 + d["accepted_total"] / d["rows_drafted"] if d["rows_drafted"] else 1.0
                frac = d["draft_steps"] / d["decode_steps"] if d["decode_steps"] and kind != "ar" else 0.0
                row = summarize(kind, dcut, c, reqs, wall, kept, mal, frac)
                if kind == "ar":   # reference: AR's output per prompt (first run that served it)
                    for r in reqs:
                        reference.setdefault(r.prompt_id, r.tokens)
                if reference:
                    row.lossless_failures = count_lossless_failures(engine.target, reqs, reference)
                rows.append(row)
                print(f"bench engine: {kind}{'+dcut' if dcut else ''} c={c}: "
                      f"{row.output_tokens_per_s:.1f} tok/s, ttft p50 {row.ttft_p50_ms:.0f} ms, "
                      f"MAL {row.mean_accepted_length:.2f}, kept {row.kept_ratio:.2f}"
                      + (f", lossless failures {row.lossless_failures}" if row.lossless_failures is not None else ""),
                      file=sys.stderr, flush=True)
            batcher.stop()
        if kind == "ar":
            ar_target = engine.target
        del engine
    if not rows:
        raise UserError("nothing to run")
    report = EngineReport(model=str(model_dir), threads=threads, max_tokens=args.max_tokens,
                          prompts=len(prompts or []), rows=rows, notes=notes)
    (out / "engine.json").write_text(json.dumps(report.model_dump(), indent=1) + "\n")
    plot(report, out / "engine.png")
    print(f"bench engine: wrote {out / 'engine.json'} and {out / 'engine.png'}")
    return 0


def counters(batcher) -> dict[str, float]:
    return {name: float(getattr(batcher, name)) for name in
            ("draft_steps", "kept_fraction_sum", "rows_drafted", "accepted_total", "decode_steps")}


def count_lossless_failures(target, reqs: list[_Req], reference: dict[str, list[int]]) -> int:
    from engines.lossless import check_lossless

    bad = 0
    for r in reqs:
        ref = reference.get(r.prompt_id)
        if ref is None:
            continue
        # whole outputs: an output that stops early (or runs on) with an equal prefix is a failure too;
        # after a near-tie the two may go on differently, lengths included
        if r.tokens != ref and not check_lossless(target, r.prompt, r.tokens, ref).ok:
            bad += 1
    return bad


def memory_check(args, model_dir: Path, spec: tuple[str, bool], out: Path) -> int:
    import torch

    from engines.factory import load_engine, make_batcher
    from engines.requests import BatcherConfig

    kind, dcut = spec
    engine = load_engine(kind, model_dir, block_size=args.block_size)
    prompts = mixed_prompts(engine.tokenizer, 64, args.max_prompt_tokens)
    batcher = make_batcher(engine, BatcherConfig(max_running=8, max_waiting=64, max_len=engine.max_context),
                           dcut=dcut, threads=torch.get_num_threads(), profile_dir=args.profile_dir).start()
    run_closed_loop(batcher, prompts, 8, 100, args.max_tokens)
    rss100 = rss_mb()
    run_closed_loop(batcher, prompts, 8, args.memory - 100, args.max_tokens)
    rss_n = rss_mb()
    batcher.stop()
    doc = {"engine": kind, "dcut": dcut, "requests": args.memory, "rss_mb_after_100": round(rss100, 1),
           f"rss_mb_after_{args.memory}": round(rss_n, 1), "growth": round(rss_n / rss100 - 1.0, 4)}
    (out / "engine_memory.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))
    return 0
