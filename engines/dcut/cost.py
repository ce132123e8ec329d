"""D-Cut's cost model: measured verify (and drafting) time on a grid of batch sizes x kept ratios.

Pure: a `CostTable` is data plus interpolation; measuring one and caching it on disk is
`engines.dcut.profile`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PROFILE_RATIOS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # 0.0 = only y0 per row
PROFILE_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


def suffix_min(a: np.ndarray, axis: int) -> np.ndarray:
    """a[..., i, ...] -> min(a[..., i:, ...]) along `axis` (non-decreasing along it)."""
    return np.flip(np.minimum.accumulate(np.flip(a, axis=axis), axis=axis), axis=axis)


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
        """Costs made non-decreasing along ratio and batch size (removes timing noise inversions).

        Each cell becomes the least cost measured for that much work or more (a suffix minimum):
        timing noise on a shared machine only ever adds time, so where verifying more measured
        cheaper than verifying less, the smaller cell's time is the inflated one. (Raising every later
        cell to the largest earlier one instead carried one slow measurement, say at ratio 0.75, into
        the cost of full verification and made long blocks look up to 50% dearer than they are.)"""
        a = suffix_min(suffix_min(np.asarray(self.ms, dtype=np.float64), axis=1), axis=0)
        d = tuple(float(x) for x in suffix_min(np.asarray(self.draft_ms, dtype=np.float64), axis=0)) \
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
