"""`specroute sim profile`: the step-cost profile of this machine for the simulator (the I/O edge).

Times the real engine's pieces on a model bundle, one torch thread, rows at a steady context:

- `draft_ms[mode][B]`: one drafter call for B rows (MTP: k = 3, DFly: its block's k);
- `verify_ms[B][w]`:   one target verify forward of B rows of w tokens each (w = 1 is a plain step);
- `prefill_ms_per_token`: chunked prefill of one prompt, per token;
- `dcut_ms[B]`: D-Cut's own work in a drafted step of B rows (choosing the rows, the selection, its
  feedback), on the controller a DFly worker builds;
- `dcut_padding[B]`: in D-Cut's drafted steps of B rows, the widest row's kept drafts over the mean
  (rows keep unequal prefixes and a verify pads to the widest), from a D-Cut batcher serving held-out
  prompts closed-loop at concurrency B.

Each figure is the least of `reps` rounds over every point after a warm-up round, in CPU time of the
one thread the engine runs on (`clock`: the machine is shared, and wall time would charge other jobs'
load). The simulator prices a step as drafts + verify at the widest row (bench/sim/core.py
`step_cost`).
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engines.dcut.profile import cpu_name
from engines.factory import load_engine, make_batcher, new_decoder
from engines.requests import BatcherConfig, BatcherObserver
from engines.sampling import SamplingParams


def clock() -> float:
    """CPU seconds of the calling thread (torch runs one thread here): on a machine other jobs share, wall
    time would price each operation by how often it was preempted (long ones more), CPU time by its work."""
    return time.thread_time()


TEXT = ("Write a Python function that returns the running median of a stream of integers, then explain "
        "its complexity and test it on a few examples. ") * 6


def measure(model: Path, batch_sizes: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16),
            widths: tuple[int, ...] = (1, 2, 4, 8, 16), reps: int = 5, context: int = 160) -> dict[str, Any]:
    torch.set_num_threads(1)
    engine = load_engine("mtp,dfly,ar", model)
    ids = engine.tokenizer.encode(TEXT)[:context]
    maxb = max(batch_sizes)
    dec = new_decoder(engine, maxb, max_len=context + 96)
    draft: dict[str, dict[str, float]] = {"mtp": {}, "dfly": {}}
    verify: dict[str, dict[str, float]] = {}
    dec.prefill_batch([0, 1], [ids] * 2, [SamplingParams()] * 2, ["mtp"] * 2)   # warm-up: thread pool, caches
    combos = [("mtp", w) for w in widths if w <= 4] + [("dfly", w) for w in widths if w > 4]
    times: dict[tuple[str, int, int], list[float]] = {}
    for rnd in range(reps + 1):   # rounds outermost: a burst of load elsewhere spreads over every point
        for B in batch_sizes:
            slots = list(range(B))
            for mode, w in combos:
                for s in slots:
                    if s in dec.slots:
                        dec.release(s)
                dec.prefill_batch(slots, [ids] * B, [SamplingParams()] * B, [mode] * B)
                k = int(engine.modes[mode].max_draft)   # type: ignore[union-attr]
                for _ in range(2):   # the drafter catches up on the prompt: steady steps from here on
                    dec.verify(slots, dec.draft(slots, k), [k] * B)
                prop = None
                if w > 1:
                    t0 = clock()
                    prop = dec.draft(slots, k)
                    if rnd:
                        times.setdefault((mode, B, w), []).append((clock() - t0) * 1000.0)
                t0 = clock()
                dec.verify(slots, prop, [w - 1] * B)
                if rnd:
                    times.setdefault(("verify", B, w), []).append((clock() - t0) * 1000.0)
    for (what, B, w), xs in sorted(times.items()):
        q = round(min(xs), 3)   # the least disturbed timing: the machine is shared
        if what == "verify":
            verify.setdefault(str(B), {})[str(w)] = q
        else:
            draft[what][str(B)] = min(q, draft[what].get(str(B), q))
    t0 = clock()
    for _ in range(3):
        if 0 in dec.slots:
            dec.release(0)
        dec.prefill(0, ids, SamplingParams())
    prefill = (clock() - t0) * 1000.0 / (3 * len(ids))
    with tempfile.TemporaryDirectory() as tmp:   # D-Cut's own cost table, measured afresh and dropped
        dcut_ms, padding = measure_dcut(model, reps, profile_dir=tmp)
    return {"cpu": cpu_name() or platform.processor(), "threads": 1, "model": str(model), "context": context,
            "draft_ms": draft, "verify_ms": verify, "prefill_ms_per_token": round(prefill, 4),
            "dcut_ms": dcut_ms, "dcut_padding": padding}


class _Keeps(BatcherObserver):
    def __init__(self) -> None:
        self.steps: list[list[int]] = []

    def on_step(self, keep: Sequence[int], accepted: Sequence[int], kept_fraction: float | None) -> None:
        if kept_fraction is not None and len(keep) >= 2:
            self.steps.append(list(keep))


def measure_dcut(model: Path, reps: int, batch_sizes: tuple[int, ...] = (2, 4, 8),
                 profile_dir: str | None = None) -> tuple[dict[str, float], dict[str, float]]:
    from bench.engine import mixed_prompts, run_closed_loop

    engine = load_engine("dfly", model)
    rec = _Keeps()
    batcher = make_batcher(engine, BatcherConfig(max_running=max(batch_sizes), max_len=engine.max_context), dcut=True,
                           threads=1, profile_dir=profile_dir, observer=rec).start()
    try:
        prompts = mixed_prompts(engine.tokenizer, 64, 256)
        run_closed_loop(batcher, prompts, 1, 1, 8)
        padding: dict[str, float] = {}
        for c in batch_sizes:
            rec.steps.clear()
            run_closed_loop(batcher, prompts, c, 4 * c, 64)
            full = [k for k in rec.steps if sum(k) > 0]
            if full:
                padding[str(c)] = round(statistics.fmean(max(k) for k in full)
                                        / statistics.fmean(statistics.fmean(k) for k in full), 3)
    finally:
        batcher.stop()
    ctl = batcher.dcut
    assert ctl is not None
    gen = np.random.default_rng(0)
    k = int(engine.block_size)
    dcut_ms: dict[str, float] = {}
    for B in (1, 2, 4, 8, 16):
        xs = []
        for _ in range(reps + 1):
            conf = gen.uniform(0.3, 1.0, (B, k)).astype(np.float32)
            t0 = clock()
            ctl.rows_to_draft([(4, 12)] * B)
            sel, raw = ctl.select(conf, [False] * B)
            ctl.observe(raw, sel.keep, [min(2, x) for x in sel.keep], sel.kept_fraction, verify_ms=10.0, sel=sel)
            xs.append((clock() - t0) * 1000.0)
        dcut_ms[str(B)] = round(min(xs[1:]), 3)
    return dcut_ms, padding


def main(model: Path, out: Path) -> None:
    doc = measure(model)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
