"""D-Cut: adaptive verification depth under a global budget (AngelSlim D-Cut, specdec-anchors §8).

Each step the drafter proposes k tokens per running request with a confidence c (the draft
probability of the chosen token). The marginal value of verifying draft position j of row i is
P(L_i >= j), estimated by the prefix product s[i, j] = f_j * prod_{t<=j} c[i, t] (f_j: a per-position
calibration factor learned from observed acceptance; scores are made non-increasing along j). A
global top-K over all (i, j) therefore keeps a prefix of every row. For each keep ratio rho in
RATIOS the expected step throughput is

    U(rho) = (bs + sum of the top-K(rho) scores) / (C(bs, rho) + overhead)

(every row emits at least one token per step: the correction or bonus), where C is the measured
verify cost table. The ratio with the highest U wins; rho = 1.0 (verify everything) is always a
candidate and the table is monotone in rho, so a chosen step is never predicted to cost more than
verifying everything.

Everything here except `profile_verify_cost` and the profile cache is a pure function of numpy
arrays; `DcutController` is the small stateful wrapper the batcher owns (calibration state, live
on/off switch, recent kept ratio).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

RATIOS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
PROFILE_RATIOS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # 0.0 = only y0 per row
PROFILE_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
PROFILE_FILE = "dcut_profile.json"
MIN_FACTOR, MAX_FACTOR = 0.05, 4.0


# --------------------------------------------------------------------------------------------------
# scores


def prefix_scores(conf: np.ndarray, factors: np.ndarray | None = None) -> np.ndarray:
    """conf [B, K] draft confidences -> s [B, K] calibrated survival estimates P(L >= j+1).

    s = cummin(clip(f_j * cumprod(c))) along j, so every row's scores are non-increasing and in [0, 1].
    """
    c = np.clip(np.asarray(conf, dtype=np.float64), 0.0, 1.0)
    s = np.cumprod(c, axis=1) if c.size else c
    if factors is not None and c.size:
        s = s * np.asarray(factors, dtype=np.float64)[None, : s.shape[1]]
    s = np.clip(s, 0.0, 1.0)
    return np.minimum.accumulate(s, axis=1) if s.size else s


# --------------------------------------------------------------------------------------------------
# cost model


@dataclass(frozen=True)
class CostTable:
    """Measured verify step time (ms) on a grid of batch sizes x kept ratios, for drafts of `draft_len`.

    `ms[i][j]` is the time of one target forward over `bs_i` rows of `1 + ceil(ratio_j * draft_len)`
    tokens each (plus the LM head). Lookups interpolate linearly in both axes and extrapolate
    proportionally beyond the largest profiled batch size.
    """

    batch_sizes: tuple[int, ...]
    ratios: tuple[float, ...]
    ms: tuple[tuple[float, ...], ...]
    draft_len: int
    draft_ms: tuple[float, ...] = ()   # one batched drafter pass per batch size (empty: not profiled)

    def monotone(self) -> CostTable:
        """Costs made non-decreasing along ratio and batch size (removes timing noise inversions)."""
        a = np.asarray(self.ms, dtype=np.float64)
        a = np.maximum.accumulate(a, axis=1)
        a = np.maximum.accumulate(a, axis=0)
        d = tuple(float(x) for x in np.maximum.accumulate(np.asarray(self.draft_ms, dtype=np.float64))) \
            if self.draft_ms else ()
        return CostTable(self.batch_sizes, self.ratios, tuple(tuple(float(x) for x in r) for r in a), self.draft_len, d)

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.asarray(self.batch_sizes, dtype=np.float64), np.asarray(self.ratios, dtype=np.float64),
                np.asarray(self.ms, dtype=np.float64))

    def cost_many(self, bs: np.ndarray, frac: np.ndarray) -> np.ndarray:
        """Vectorised `cost`: bilinear in (batch size, kept fraction); 0 for empty batches."""
        bss, ratios, a = self._arrays
        bs = np.asarray(bs, dtype=np.float64)
        shape = np.broadcast_shapes(bs.shape, np.shape(frac))
        bs = np.broadcast_to(bs, shape).reshape(-1)
        frac = np.clip(np.broadcast_to(np.asarray(frac, dtype=np.float64), shape).reshape(-1), ratios[0], ratios[-1])
        if len(ratios) > 1:
            j = np.clip(np.searchsorted(ratios, frac, side="right") - 1, 0, len(ratios) - 2)
            w = (frac - ratios[j]) / (ratios[j + 1] - ratios[j])
            col = a[:, j] * (1.0 - w) + a[:, j + 1] * w          # [n_bs, Q]
        else:
            col = np.repeat(a[:, :1], frac.size, axis=1)
        q = np.arange(bs.size)
        if len(bss) > 1:
            i = np.clip(np.searchsorted(bss, bs, side="right") - 1, 0, len(bss) - 2)
            wb = np.clip((bs - bss[i]) / (bss[i + 1] - bss[i]), 0.0, 1.0)
            out = col[i, q] * (1.0 - wb) + col[i + 1, q] * wb
        else:
            out = col[0, q]
        out = np.where(bs > bss[-1], col[-1, q] * bs / bss[-1], out)
        return np.where(bs <= 0, 0.0, out).reshape(shape)

    @functools.cached_property
    def _memo(self) -> dict[tuple[int, float], float]:
        return {}

    def cost(self, bs: int, frac: float) -> float:
        """Predicted verify time (ms) for `bs` rows keeping a fraction `frac` of the drafted positions
        (memoised: the batcher asks for the same few points every step)."""
        key = (int(bs), round(float(frac), 4))
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) > 4096:
                self._memo.clear()
            hit = self._memo[key] = float(self.cost_many(np.array([key[0]]), np.array([key[1]]))[0])
        return hit

    def draft_cost(self, bs: int) -> float | None:
        """Predicted drafter pass time (ms) for `bs` rows: linear in batch size between profiled sizes,
        proportional beyond the largest; None when drafting was not profiled."""
        if not self.draft_ms or bs <= 0:
            return None if not self.draft_ms else 0.0
        bss = self.batch_sizes
        if bs >= bss[-1]:
            return self.draft_ms[-1] * bs / bss[-1]
        return float(np.interp(bs, bss, self.draft_ms))

    def with_draft_ms(self, draft_ms: Sequence[float]) -> CostTable:
        if len(draft_ms) != len(self.batch_sizes):
            raise ValueError("draft costs need one value per profiled batch size")
        return CostTable(self.batch_sizes, self.ratios, self.ms, self.draft_len, tuple(float(x) for x in draft_ms))

    def to_dict(self) -> dict:
        d = {"batch_sizes": list(self.batch_sizes), "ratios": list(self.ratios),
             "ms": [list(r) for r in self.ms], "draft_len": self.draft_len}
        if self.draft_ms:
            d["draft_ms"] = list(self.draft_ms)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CostTable:
        ms = tuple(tuple(float(x) for x in r) for r in d["ms"])
        bs = tuple(int(b) for b in d["batch_sizes"])
        ratios = tuple(float(r) for r in d["ratios"])
        draft = tuple(float(x) for x in d.get("draft_ms", ()))
        if len(ms) != len(bs) or any(len(r) != len(ratios) for r in ms) or not bs or (draft and len(draft) != len(bs)):
            raise ValueError("malformed D-Cut cost table")
        return cls(bs, ratios, ms, int(d["draft_len"]), draft)

    @classmethod
    def linear(cls, draft_len: int, base_ms: float = 1.0, per_token_ms: float = 0.1,
               batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES) -> CostTable:
        """Analytic table `base + per_token * bs * tokens_per_row` (tests, and a fallback)."""
        rows = []
        for b in batch_sizes:
            rows.append(tuple(base_ms + per_token_ms * b * (1 + math.ceil(r * draft_len)) for r in PROFILE_RATIOS))
        return cls(tuple(batch_sizes), PROFILE_RATIOS, tuple(rows), draft_len)


# --------------------------------------------------------------------------------------------------
# selection


@dataclass(frozen=True)
class Selection:
    keep: list[int]            # draft tokens verified per row (a prefix)
    ratio: float               # chosen bucket (1.0 when nothing was pruned by choice)
    kept_fraction: float       # verified draft positions / drafted positions
    expected_tokens: float     # bs + sum of kept scores
    cost_ms: float             # predicted verify time (all groups)
    full_cost_ms: float        # predicted verify time without pruning (one forward)
    groups: list[list[int]] = field(default_factory=list)  # rows per verify forward (all rows: one group)


def plan_groups(keep: Sequence[int], K: int, table: CostTable, max_groups: int = 3) -> tuple[list[list[int]], float]:
    """Split rows into at most `max_groups` verify forwards by kept depth.

    A forward over ragged rows is padded to its widest row, so its cost is C(rows, max keep / K).
    Rows are ordered by keep (descending) and cut into contiguous groups at distinct depths; the cut
    with the lowest predicted total cost wins (one group when extra forwards do not pay)."""
    keep_a = np.asarray(keep, dtype=np.int64)
    B = keep_a.size
    if B == 0:
        return [], 0.0
    if K <= 0:
        return [list(range(B))], float(table.cost_many(np.array([B]), np.array([0.0]))[0])
    levels, counts = np.unique(keep_a, return_counts=True)
    levels, counts = levels[::-1], counts[::-1]          # deepest first
    L = levels.size
    csum = np.concatenate(([0], np.cumsum(counts)))
    G = max(1, min(max_groups, L))
    # candidate cuts: boundaries 0 = c0 < c1 <= c2 <= ... <= L (equal boundaries = fewer groups)
    if G == 1:
        cuts = np.array([[0, L]])
    elif G == 2:
        c1 = np.arange(1, L + 1)
        cuts = np.stack([np.zeros_like(c1), c1, np.full_like(c1, L)], axis=1)
    else:
        i, j = np.triu_indices(L + 1, k=0)
        ok = (i >= 1) & (j >= i)
        i, j = i[ok], j[ok]
        cuts = np.stack([np.zeros_like(i), i, j, np.full_like(i, L)], axis=1)
    lo, hi = cuts[:, :-1], cuts[:, 1:]
    n = csum[hi] - csum[lo]                                # rows per group
    depth = np.where(n > 0, levels[np.minimum(lo, L - 1)], 0)
    cost = table.cost_many(n, depth / K).sum(axis=1)
    best = int(np.argmin(cost))
    order = np.argsort(-keep_a, kind="stable")
    groups = [order[csum[a]:csum[b]].tolist() for a, b in zip(lo[best], hi[best], strict=True) if csum[b] > csum[a]]
    return groups, float(cost[best])


def select_keep(scores: np.ndarray, table: CostTable, forced: Sequence[bool] | None = None,
                ratios: Sequence[float] = RATIOS, overhead_ms: float = 0.0, max_groups: int = 3) -> Selection:
    """Global top-K selection over calibrated scores [B, K] (non-increasing along each row).

    Rows with `forced[i]` (per-request D-Cut switched off) keep all K drafts; the ratio applies to
    the others. Ties are broken by row-major order, so kept sets are prefixes even for equal scores.
    Each candidate's cost is that of its best split into at most `max_groups` padded forwards.
    """
    s = np.asarray(scores, dtype=np.float64)
    B = s.shape[0]
    K = s.shape[1] if s.ndim == 2 else 0
    if B == 0 or K == 0:
        c = table.cost(max(B, 1), 0.0)
        return Selection([0] * B, 1.0, 0.0, float(B), c, c, [list(range(B))] if B else [])
    forced_mask = np.zeros(B, dtype=bool) if forced is None else np.asarray(forced, dtype=bool)
    free = ~forced_mask
    free_rows = np.nonzero(free)[0]
    base_tokens = float(B) + float(s[forced_mask].sum())
    flat = s[free].reshape(-1)
    order = np.argsort(-flat, kind="stable")
    csum = np.concatenate(([0.0], np.cumsum(flat[order])))
    full_cost = table.cost(B, 1.0)
    best = None  # (U, rho, keep, expected, cost, groups)
    for rho in sorted(set(ratios)):
        k_free = min(flat.size, math.ceil(rho * flat.size - 1e-9))
        keep = np.where(forced_mask, K, 0)
        if k_free:
            np.add.at(keep, free_rows[order[:k_free] // K], 1)
        if rho >= 1.0 and k_free == flat.size:
            groups, cost = [list(range(B))], full_cost
        else:
            groups, cost = plan_groups(keep, K, table, max_groups)
        expected = base_tokens + float(csum[k_free])
        u = expected / max(cost + overhead_ms, 1e-9)
        if best is None or u > best[0] + 1e-12:
            best = (u, rho, keep, expected, cost, groups)
    assert best is not None
    _, rho, keep, expected, cost, groups = best
    return Selection([int(x) for x in keep], float(rho), int(keep.sum()) / (B * K), expected, cost, full_cost,
                     groups)


# --------------------------------------------------------------------------------------------------
# calibration


@dataclass(frozen=True)
class Calibration:
    """Decayed per-position sums of predicted (raw prefix products) and observed acceptance."""

    pred: tuple[float, ...]
    obs: tuple[float, ...]
    decay: float = 0.995
    prior: float = 2.0  # pseudo-observations pulling factors towards 1

    @classmethod
    def empty(cls, k: int, decay: float = 0.995) -> Calibration:
        return cls(tuple([0.0] * k), tuple([0.0] * k), decay)

    def factors(self) -> np.ndarray:
        pred, obs = np.asarray(self.pred), np.asarray(self.obs)
        f = (obs + self.prior) / (pred + self.prior)
        return np.clip(f, MIN_FACTOR, MAX_FACTOR)


def calibrate(cal: Calibration, raw: np.ndarray, keep: Sequence[int], accepted: Sequence[int]) -> Calibration:
    """Update with one step: row i verified keep[i] drafts (raw prefix products `raw[i]`) and accepted
    accepted[i] of them. Position j is observed for j < keep[i]; it survived iff accepted[i] > j."""
    raw = np.asarray(raw, dtype=np.float64)
    K = len(cal.pred)
    if raw.size == 0 or K == 0:
        return cal
    keep_a = np.asarray(keep)[:, None]
    acc_a = np.asarray(accepted)[:, None]
    j = np.arange(raw.shape[1])[None, :]
    seen = j < keep_a
    pred_add = np.where(seen, raw, 0.0).sum(0)
    obs_add = (seen & (j < acc_a)).sum(0).astype(np.float64)
    pad = K - raw.shape[1]
    if pad > 0:
        pred_add = np.concatenate([pred_add, np.zeros(pad)])
        obs_add = np.concatenate([obs_add, np.zeros(pad)])
    pred = np.asarray(cal.pred) * cal.decay + pred_add[:K]
    obs = np.asarray(cal.obs) * cal.decay + obs_add[:K]
    return Calibration(tuple(float(x) for x in pred), tuple(float(x) for x in obs), cal.decay, cal.prior)


# --------------------------------------------------------------------------------------------------
# profiling (I/O at the edge)


def machine_key(threads: int, draft_len: int, drafter: str = "") -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    key = f"{platform.system()}-{platform.machine()}|{cpu}|threads={threads}|draft_len={draft_len}"
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
    """Time one verify forward (target + LM head) for each (batch size, ratio): median of `reps`."""
    import torch

    from engines.model import KVCache

    cfg = target.config
    bmax = max(batch_sizes)
    cache = KVCache.for_model(cfg, bmax, context + draft_len + 2, dtype=next(target.parameters()).dtype)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for bs in batch_sizes:
            row = []
            for rho in ratios:
                t = 1 + math.ceil(rho * draft_len)
                tokens = torch.randint(0, cfg.vocab_size, (bs, t), generator=gen)
                positions = (context + torch.arange(t))[None].expand(bs, t).contiguous()
                slots = torch.arange(bs)
                times = []
                for i in range(reps + 1):
                    t0 = time.perf_counter()
                    out = target(tokens, positions, cache, slots, capture)
                    target.logits(out.hidden)
                    if i:  # first run is warm-up
                        times.append((time.perf_counter() - t0) * 1000.0)
                row.append(float(np.median(times)))
            rows.append(tuple(row))
    return CostTable(tuple(batch_sizes), tuple(ratios), tuple(rows), draft_len).monotone()


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


# --------------------------------------------------------------------------------------------------
# the batcher's stateful wrapper


def drafting_pays(expected: float, verify_ms: float, draft_ms: float, bs: int, ar_ms: float,
                  margin: float = 0.05) -> bool:
    """Is a speculative step (expected tokens over verify + draft time) at least as fast as a plain
    decoding step (bs tokens over the cost of verifying y0 only), within `margin`?"""
    if bs <= 0:
        return True
    return expected / max(verify_ms + draft_ms, 1e-9) * (1.0 + margin) >= bs / max(ar_ms, 1e-9)


PROBE_FIRST, PROBE_MAX = 8, 1024    # plain steps between probes: PROBE_FIRST x batch size, doubling
PROBE_ROWS = 1                      # rows a probe drafts for (the rest of the batch takes a plain step)
ROW_PRIOR = 4.0                     # pseudo-steps of the fleet average in each row's estimate


def bs_bucket(bs: int) -> int:
    """Power-of-two bucket of a batch size (plain-step runs and probe intervals are kept per bucket)."""
    return 1 << max(0, int(bs) - 1).bit_length()


@dataclass
class DcutController:
    """Owned by the batcher's loop thread; `enabled` may be flipped from any thread (live switch).

    Besides choosing keep per step it decides, before drafting, whether drafting pays at the current
    batch size, from the cost model: profiled drafting and verify times (scaled by what drafted steps
    measure) and the tokens per row that drafted steps actually emitted. Where it does not pay the
    batcher runs plain decoding steps (the drafter catches up on the committed context at its next
    pass), with a speculative probe after 32, 64, ... up to 1024 plain steps so that the acceptance
    estimate stays current. (Measured whole-step rates were tried as the arbiter: one step's time
    swings with the drafter's catch-up on a new prompt, and the decision flapped.)"""

    table: CostTable
    k: int
    enabled: bool = True
    ratios: tuple[float, ...] = RATIOS
    calibration: Calibration = field(init=False)
    overhead_ms: float = 0.0          # EMA of the non-verify part of a drafted step (draft, selection)
    cost_scale: float = 1.0           # EMA of measured / predicted verify time
    draft_scale: float = 1.0          # EMA of measured / profiled drafting time (steady-state steps)
    kept_fraction_ema: float = 1.0
    tokens_per_row_ema: float = 0.0   # tokens emitted per row on drafted steps (0: none observed yet)
    skip_drafting: bool = True        # allow plain steps when drafting does not pay
    probe_first: int = PROBE_FIRST    # plain steps per running row before the first probe
    probe_rows: int = PROBE_ROWS
    skipped_steps: int = 0
    cursor: int = 0                   # rotates the rows a probe drafts for
    unmeasured_seen: int = 0
    plain_run: dict = field(default_factory=dict)    # bs bucket -> plain steps since the last probe
    probe_every: dict = field(default_factory=dict)  # bs bucket -> plain steps between probes
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.calibration = Calibration.empty(self.k)

    def set_enabled(self, on: bool) -> None:
        with self._lock:
            self.enabled = bool(on)
            self.plain_run.clear()
            self.probe_every.clear()

    def draft_ms(self, bs: int) -> float:
        """Predicted drafting time of one step at batch size `bs` (profile x measured scale, else the
        measured non-verify overhead)."""
        d = self.table.draft_cost(bs)
        return self.overhead_ms if d is None else d * self.draft_scale

    def pays(self, bs: int, tokens_per_row: float | None = None) -> bool:
        """Expected speculative tokens/ms (`tokens_per_row` per drafted row: by default the observed
        average, or an optimistic prior of half the drafts accepted before any observation) against a
        plain step's, both from the cost model."""
        tpr = tokens_per_row or self.tokens_per_row_ema or 1.0 + 0.5 * self.k
        verify = self.table.cost(bs, self.kept_fraction_ema) * self.cost_scale
        plain = self.table.cost(bs, 0.0) * self.cost_scale
        return drafting_pays(bs * tpr, verify, self.draft_ms(bs), bs, plain)

    def rows_to_draft(self, rows: Sequence[tuple[int, int]]) -> list[int]:
        """Which running rows this step drafts for, given each row's (drafted steps, tokens those steps
        emitted). A row's tokens per drafted step is its own record shrunk towards the fleet average
        (`ROW_PRIOR` pseudo-steps), so one unlucky step does not switch a good row off. All rows draft
        where that pays for the batch; none (a plain step) where it does not, except every
        `probe_every` plain steps a probe drafting for `probe_rows` rows (unmeasured rows first, else
        rotating), which keeps the estimates current at little cost. The probe interval starts at
        `probe_first` x batch size (one row's estimate matters less in a bigger batch) and doubles up
        to PROBE_MAX while drafting keeps losing; a newly admitted row restarts it."""
        bs = len(rows)
        if not self.enabled or not self.skip_drafting or bs <= 0:
            return list(range(bs))
        prior = self.tokens_per_row_ema or 1.0 + 0.5 * self.k
        est = [(tokens + ROW_PRIOR * prior) / (steps + ROW_PRIOR) for steps, tokens in rows]
        b = bs_bucket(bs)
        if self.pays(bs, sum(est) / bs):
            self.probe_every.pop(b, None)
            self.plain_run.pop(b, None)
            return list(range(bs))
        first = self.probe_first * bs
        unmeasured = [i for i, (steps, _) in enumerate(rows) if steps == 0]
        if unmeasured and self.unmeasured_seen < len(unmeasured):   # a new row: probe it soon
            self.probe_every[b] = min(self.probe_every.get(b, first), first)
        self.unmeasured_seen = len(unmeasured)
        n = self.plain_run.get(b, 0) + 1
        every = self.probe_every.get(b, first)
        if n > every:                                  # probe after `every` plain steps
            self.plain_run[b] = 0
            self.probe_every[b] = min(2 * every, PROBE_MAX)
            self.cursor += 1
            order = unmeasured + [(self.cursor + i) % bs for i in range(bs)]
            return sorted(list(dict.fromkeys(order))[:min(self.probe_rows, bs)])
        self.plain_run[b] = n
        self.skipped_steps += 1
        return []

    def select(self, conf: np.ndarray, forced: Sequence[bool]) -> tuple[Selection, np.ndarray]:
        """-> (selection, raw prefix products for `observe`)."""
        raw = prefix_scores(conf)
        scores = prefix_scores(conf, self.calibration.factors())
        sel = select_keep(scores, self.table, forced, self.ratios, self.draft_ms(conf.shape[0]) / self.cost_scale)
        return sel, raw

    def observe(self, raw: np.ndarray, keep: Sequence[int], accepted: Sequence[int], kept_fraction: float,
                overhead_ms: float | None = None, verify_ms: float | None = None,
                sel: Selection | None = None) -> None:
        """After a drafted step. `overhead_ms` (the drafting part) should be passed only for
        steady-state steps, not ones where the drafter caught up on a long backlog of context."""
        self.calibration = calibrate(self.calibration, raw, keep, accepted)
        self.kept_fraction_ema = 0.95 * self.kept_fraction_ema + 0.05 * kept_fraction
        bs = len(keep)
        if bs:
            tpr = 1.0 + sum(accepted) / bs
            self.tokens_per_row_ema = tpr if self.tokens_per_row_ema == 0.0 else 0.9 * self.tokens_per_row_ema + 0.1 * tpr
        if overhead_ms is not None:
            self.overhead_ms = overhead_ms if self.overhead_ms == 0.0 else 0.9 * self.overhead_ms + 0.1 * overhead_ms
            predicted = self.table.draft_cost(bs)
            if predicted:
                ratio = min(max(overhead_ms / predicted, 0.25), 4.0)
                self.draft_scale = 0.9 * self.draft_scale + 0.1 * ratio
        if verify_ms is not None and sel is not None and sel.cost_ms > 0:
            ratio = min(max(verify_ms / sel.cost_ms, 0.25), 4.0)
            self.cost_scale = 0.9 * self.cost_scale + 0.1 * ratio
