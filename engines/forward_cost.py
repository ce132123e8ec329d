"""How a target forward's cost grows with the tokens it carries, measured once when a worker starts.

A decode step verifies `rows x (1 + drafts)` tokens in one forward. While the forward is
memory-bound those tokens are almost free; once it turns compute-bound each one costs its share. A
linear fit `cost(n) = base + n * per_token` says where: at `compute_bound_tokens = base / per_token`
tokens a forward costs twice a one-token one. On a GPU that is hundreds of tokens; on this 2-core CPU
it is about 15, which is why a speculative pool loses to plain decoding under load here.

The worker reports the figure in `Info` (`InfoResponse.compute_bound_tokens`) and the router's
goodput estimate (router/routing/estimate.py) uses it for that pool's load term instead of a fleet-wide
guess. Timing is the only I/O here; the fit is `fit_compute_bound`, a pure function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from engines.model import KVCache, Transformer

ROWS = 8            # the large forward: ROWS rows of `tokens // ROWS` tokens, as a batched verify step
NEVER = 1e6         # reported when the large forward measured no dearer than the small one (noise)


@dataclass(frozen=True)
class LinearCost:
    """`cost(n) = base + n * per_token` in units of `per_token`: a forward of n tokens costs
    `compute_bound_tokens + n`. Speaks `CostTable.cost_many`, so D-Cut's `plan_groups` can split a
    ragged verify by it (a worker serving several modes pads an MTP row to a DFly row's width)."""

    compute_bound_tokens: float
    draft_len: int

    def cost(self, bs: int, frac: float) -> float:
        """One forward over `bs` rows of `1 + frac * draft_len` tokens each."""
        return float(self.cost_many(np.array([bs]), np.array([frac]))[0])

    def cost_many(self, rows: np.ndarray, ratio: np.ndarray) -> np.ndarray:
        """Cost of forwards over `rows` rows of `1 + ratio * draft_len` tokens each (0 rows: nothing)."""
        rows = np.asarray(rows, dtype=np.float64)
        tokens = rows * (1.0 + np.ceil(np.asarray(ratio, dtype=np.float64) * self.draft_len - 1e-9))
        return np.where(rows > 0, self.compute_bound_tokens + tokens, 0.0)


def fit_compute_bound(one_ms: float, many_ms: float, tokens: int) -> float:
    """Tokens per forward at which a forward costs twice a one-token forward, from the cost of a
    one-token forward and of a `tokens`-token one (`NEVER` when the second is not dearer)."""
    per_token = (many_ms - one_ms) / max(tokens - 1, 1)
    if per_token <= 0.0 or one_ms <= 0.0:
        return NEVER
    base = max(one_ms - per_token, 1e-6)
    return float(min(NEVER, max(1.0, base / per_token)))


@torch.no_grad()
def measure_compute_bound(target: Transformer, tokens: int = 64, context: int = 128, reps: int = 5) -> float:
    """Time a 1-row, 1-token forward and a `ROWS`-row forward of `tokens` tokens in all (target and LM
    head, at positions after `context` cached ones), in interleaved rounds after a warm-up round,
    lower quartile of each; -> `fit_compute_bound` of the two."""
    cfg = target.config
    t = max(1, tokens // ROWS)
    cache = KVCache.for_model(cfg, ROWS, context + t + 1, dtype=next(target.parameters()).dtype)
    gen = torch.Generator().manual_seed(0)
    shapes = ((1, 1), (ROWS, t))
    times: list[list[float]] = [[], []]
    for rnd in range(reps + 1):
        for j in ((0, 1) if rnd % 2 == 0 else (1, 0)):
            bs, n = shapes[j]
            toks = torch.randint(0, cfg.vocab_size, (bs, n), generator=gen)
            positions = (context + torch.arange(n))[None].expand(bs, n).contiguous()
            t0 = time.perf_counter()
            target.logits(target(toks, positions, cache, torch.arange(bs)).hidden)
            if rnd:  # the first round is a warm-up
                times[j].append((time.perf_counter() - t0) * 1000.0)
    one, many = (float(np.percentile(x, 25)) for x in times)
    return fit_compute_bound(one, many, ROWS * t)
