"""D-Cut's decision math, pure functions of numpy arrays (no I/O, no state).

- `prefix_scores`: draft confidences -> calibrated survival estimates P(L >= j) per row and position;
- `select_keep`: the global top-K over those scores under the cost table, with the ratio of the best
  expected throughput (`plan_groups` splits the rows into at most a few padded verify forwards);
- `pre_draft_conf` / `cut_conditioned`: the same decision when a row's later confidences read its
  earlier drafts (it may look only at what is known before the draft it decides on);
- `calibrate` / `Calibration`: per-position factors learned from observed acceptance;
- `drafting_pays`: whether a speculative step beats a plain one at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engines.dcut.cost import CostTable

RATIOS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
MIN_FACTOR, MAX_FACTOR = 0.05, 4.0


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
                ratios: Sequence[float] = RATIOS, overhead_ms: float = 0.0, max_groups: int = 3,
                cut_margin: float = 0.0) -> Selection:
    """Global top-K selection over calibrated scores [B, K] (non-increasing along each row).

    Rows with `forced[i]` (per-request D-Cut switched off) keep all K drafts; the ratio applies to
    the others. Ties are broken by row-major order, so kept sets are prefixes even for equal scores.
    Each candidate's cost is that of its best split into at most `max_groups` padded forwards. A
    candidate that prunes must beat verifying everything by `cut_margin / sqrt(B)` (a fraction of
    U): the expected tokens are a sum over B rows' estimates, whose errors average out as B grows.
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
    margin = cut_margin / math.sqrt(B)
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
        if k_free < flat.size:
            u /= 1.0 + margin
        if best is None or u > best[0] + 1e-12:
            best = (u, rho, keep, expected, cost, groups)
    assert best is not None
    _, rho, keep, expected, cost, groups = best
    return Selection([int(x) for x in keep], float(rho), int(keep.sum()) / (B * K), expected, cost, full_cost,
                     groups)


# --------------------------------------------------------------------------------------------------
# exactness: a decision that never looks at the draft it decides on


def pre_draft_conf(conf: np.ndarray, conditioned: Sequence[bool]) -> np.ndarray:
    """conf [B, K] -> what is known of every row's confidences before any of its drafts is drawn: a
    conditioned row's conf at j > 0 depends on its drafts before j, so it is replaced by its first
    (each position taken to be as confident as the first); the other rows' are all known already."""
    c = np.array(conf, dtype=np.float64)
    rows = np.asarray(conditioned, dtype=bool)
    if c.size and rows.any():
        c[rows] = c[rows, :1]
    return c


def cut_conditioned(sel: Selection, proxy: np.ndarray, scores: np.ndarray, conditioned: Sequence[bool],
                    table: CostTable, forced: Sequence[bool] | None = None, max_groups: int = 3) -> Selection:
    """A selection made on `proxy` [B, K] (`prefix_scores` of `pre_draft_conf`) -> the one to run.

    Position j of a conditioned row may be verified on what is known before d_j is drawn: its
    confidences up to j (which read its drafts before j), never later ones (which read d_j). The
    selection over the proxies sets a threshold, its lowest kept score (none kept: +inf; all kept:
    -inf), and a conditioned row keeps the prefix of its real `scores` at or above it: whether j is
    verified reads scores[b, :j+1] only, a stopping rule, so the verified drafts stay distributed as
    q and the rejection rule exact. The other rows keep the selection's own keep; groups and cost are
    planned again for the keep that results."""
    B, K = scores.shape
    cond = np.asarray(conditioned, dtype=bool)
    forced_mask = np.zeros(B, dtype=bool) if forced is None else np.asarray(forced, dtype=bool)
    cut = cond & ~forced_mask
    if B == 0 or K == 0 or not cut.any():
        return sel
    kept = np.asarray(sel.keep)
    free = ~forced_mask
    if int(kept[free].sum()) == int(free.sum()) * K:
        threshold = -np.inf
    else:
        lowest = [proxy[b, kept[b] - 1] for b in np.nonzero(free & (kept > 0))[0]]
        threshold = min(lowest) if lowest else np.inf
    keep = kept.copy()
    keep[cut] = (scores[cut] >= threshold).sum(1)   # scores are non-increasing: a prefix
    groups, cost = plan_groups(keep, K, table, max_groups)
    expected = float(B) + float(np.where(np.arange(K)[None, :] < keep[:, None], scores, 0.0).sum())
    return Selection([int(x) for x in keep], sel.ratio, int(keep.sum()) / (B * K), expected, cost, sel.full_cost_ms,
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


def drafting_pays(expected: float, verify_ms: float, draft_ms: float, bs: int, ar_ms: float,
                  margin: float = 0.05) -> bool:
    """Is a speculative step (expected tokens over verify + draft time) at least as fast as a plain
    decoding step (bs tokens over the cost of verifying y0 only), within `margin`?"""
    if bs <= 0:
        return True
    return expected / max(verify_ms + draft_ms, 1e-9) * (1.0 + margin) >= bs / max(ar_ms, 1e-9)


def bs_bucket(bs: int) -> int:
    """Power-of-two bucket of a batch size (plain-step runs and probe intervals are kept per bucket)."""
    return 1 << max(0, int(bs) - 1).bit_length()
