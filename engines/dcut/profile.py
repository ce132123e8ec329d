"""Measuring D-Cut's cost table and caching it per machine (the I/O edge of D-Cut).

The profile lives in `model_dir/dcut_profile.json` (or a per-model file in a cache directory), one
entry per `machine_key`: CPU, thread count, draft length and drafter kind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engines.dcut.cost import PROFILE_BATCH_SIZES, PROFILE_RATIOS, CostTable

PROFILE_FILE = "dcut_profile.json"
PROFILE_VERSION = 2   # 2: interleaved rounds, lower quartile, suffix-minimum repair (re-profile older ones)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_key(threads: int, draft_len: int, drafter: str = "") -> str:
    """What a cost profile depends on: platform, CPU, threads, draft length, how it was measured (and
    drafter kind)."""
    cpu = cpu_name() or platform.processor() or ""
    key = f"{platform.system()}-{platform.machine()}|{cpu}|threads={threads}|draft_len={draft_len}|v{PROFILE_VERSION}"
    return f"{key}|drafter={drafter}" if drafter else key


def profile_path(model_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """`model_dir/dcut_profile.json` when writable, else a per-model file in a cache directory."""
    model_dir = Path(model_dir)
    if cache_dir is not None:
        digest = hashlib.sha1(str(model_dir.resolve()).encode()).hexdigest()[:12]
        return Path(cache_dir) / f"{model_dir.name}-{digest}-{PROFILE_FILE}"
    if os.access(model_dir, os.W_OK):
        return model_dir / PROFILE_FILE
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specroute" / "dcut"
    return profile_path(model_dir, base)


def load_profile(path: Path, key: str) -> CostTable | None:
    try:
        doc = json.loads(path.read_text())
        return CostTable.from_dict(doc[key]).monotone()
    except (OSError, KeyError, ValueError, TypeError):
        return None


def save_profile(path: Path, key: str, table: CostTable) -> None:
    try:
        doc = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        doc = {}
    doc[key] = table.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def profile_verify_cost(target, draft_len: int, batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES,
                        ratios: Sequence[float] = PROFILE_RATIOS, context: int = 128, reps: int = 5,
                        capture: Sequence[int] = ()) -> CostTable:
    """Time one verify forward (target + LM head) for each (batch size, ratio).

    The cells are timed in interleaved rounds (every cell once per round, the order reversed every
    other round) and each keeps its lower quartile: on a shared machine the load comes and goes,
    and timing one cell `reps` times in a row let a busy second inflate that cell alone, which
    `CostTable.monotone` then had to repair. The first round is a warm-up."""
    import torch

    from engines.model import KVCache

    cfg = target.config
    bmax = max(batch_sizes)
    cache = KVCache.for_model(cfg, bmax, context + draft_len + 2, dtype=next(target.parameters()).dtype)
    gen = torch.Generator().manual_seed(0)
    cells = [(i, j) for i in range(len(batch_sizes)) for j in range(len(ratios))]
    times: dict[tuple[int, int], list[float]] = {c: [] for c in cells}
    with torch.no_grad():
        for rnd in range(reps + 1):
            for i, j in cells if rnd % 2 == 0 else cells[::-1]:
                bs, t = batch_sizes[i], 1 + math.ceil(ratios[j] * draft_len)
                tokens = torch.randint(0, cfg.vocab_size, (bs, t), generator=gen)
                positions = (context + torch.arange(t))[None].expand(bs, t).contiguous()
                t0 = time.perf_counter()
                out = target(tokens, positions, cache, torch.arange(bs), capture)
                target.logits(out.hidden)
                if rnd:  # the first round is a warm-up
                    times[(i, j)].append((time.perf_counter() - t0) * 1000.0)
    rows = tuple(tuple(float(np.percentile(times[(i, j)], 25)) for j in range(len(ratios)))
                 for i in range(len(batch_sizes)))
    return CostTable(tuple(batch_sizes), tuple(ratios), rows, draft_len).monotone()


def profile_draft_cost(decoder, k: int, batch_sizes: Sequence[int], context: int = 128, reps: int = 3,
                       new_positions: int = 3) -> tuple[float, ...]:
    """Time one batched drafter pass (`decoder.draft(slots, k)`) per batch size: rows of `context`
    committed tokens plus `new_positions` freshly committed ones, the context a drafter ingests after a
    typical step. Uses the decoder's own slots 0..bs-1 and releases them: call before serving."""
    import torch

    from engines.sampling import SamplingParams

    gen = torch.Generator().manual_seed(0)
    V = decoder.target.config.vocab_size
    out = []
    for bs in batch_sizes:
        slots = list(range(bs))
        for s in slots:
            decoder.prefill(s, torch.randint(3, V, (context,), generator=gen).tolist(), SamplingParams())
        times = []
        for i in range(reps + 1):
            for _ in range(new_positions):     # plain steps commit tokens the next draft ingests
                decoder.verify(slots, None, [0] * bs)
            t0 = time.perf_counter()
            decoder.draft(slots, k)
            if i:  # first run is warm-up
                times.append((time.perf_counter() - t0) * 1000.0)
        for s in slots:
            decoder.release(s)
        out.append(float(np.median(times)))
    return tuple(out)


def load_or_profile(target, model_dir: str | Path | None, draft_len: int, threads: int,
                    cache_dir: str | Path | None = None, decoder=None, **kw) -> CostTable:
    """Cached profile keyed by machine, thread count, draft length (and drafter, when `decoder` is
    given: its drafting time per batch size is profiled too); re-profiled when missing."""
    drafter = getattr(decoder, "drafter", None)
    tag = f"{drafter.kind}" if drafter is not None else ""
    key = machine_key(threads, draft_len, tag)
    path = profile_path(model_dir, cache_dir) if model_dir is not None else None
    if path is not None:
        table = load_profile(path, key)
        if table is not None and (drafter is None or table.draft_ms):
            return table
    table = profile_verify_cost(target, draft_len, **kw)
    if drafter is not None:
        ctx = min(int(kw.get("context", 128)), decoder.max_len - 4 * 4 - 2)
        table = table.with_draft_ms(profile_draft_cost(decoder, draft_len, table.batch_sizes, context=ctx)).monotone()
    if path is not None:
        with contextlib.suppress(OSError):
            save_profile(path, key, table)
    return table
