"""Expected goodput of a pool for one request: hierarchical shrinkage over the statistics levels of
the request's context, and a load term for the pool's current batch and D-Cut. Pure: no I/O, no
clock, randomness only from the RNG passed in.

Levels (specroute/contracts/context.py `level_keys`), most general first: global (`*`, every request
of the pool), domain, coarse context (domain x temperature), full context (x script x length). Each
level's decayed counts are shrunk toward the estimate of the level above it, which acts as a prior
worth at most `backoff_weight` requests:

    acceptance:  Beta(a, b) with a, b = m * s + alpha_L * e_L, (1 - m) * s + (1 - alpha_L) * e_L
                 m = the parent posterior mean, s = min(parent strength, backoff_weight * epr),
                 e_L = n_L * epr (epr = `evidence_per_request`); the top level's prior is
                 `prior_acceptance`
    k, step_ms:  x_L = (w * x_parent + n_L * raw_L) / (w + n_L), w = min(parent weight, backoff_weight)

So a context with few requests follows its domain (and a domain with few, the pool's global
figure), and one with many more than `backoff_weight` stands on its own evidence.

Goodput (output tokens per second of one request) at the pool's current state:

    k_now   = 0 for a pool that does not speculate (`ar`), else min(k, drafts per step D-Cut keeps now)
    step(b) = step_ms * (1 + b * (1 + k_now) / compute_bound_tokens),  b = running per endpoint
    goodput = (1 + k_now * alpha) * 1000 / step(b) / (1 + waiting / max_running)

`1 + k * alpha` is the mean accepted length in expectation. The batch term says that verifying
`k + 1` tokens per request is free while a forward is memory-bound and costs its share once the
batch's tokens per forward approach `compute_bound_tokens`: at a large batch a speculative pool's
advantage falls toward `(1 + k alpha) / (1 + k) < 1`, and a pool that does not speculate wins.
`step_ms` is the observed step time, taken as the light-load one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specroute.contracts.feedback import CellStats

# engine kinds (InfoResponse.engine) that never draft: their pools are plain autoregressive decoding
NON_SPECULATIVE_ENGINES = frozenset({"ar"})


class Learning(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    method: Literal["thompson", "ucb"] = "thompson"
    min_samples: float = Field(default=5.0, ge=0.0, description="decayed requests before a cell is trusted")
    switch_margin: float = Field(default=0.05, ge=0.0, le=10.0, description="relative goodput gain to leave the default")
    evidence_per_request: float = Field(default=4.0, gt=0.0, le=1000.0, description="Beta pseudo-counts per request")
    prior_acceptance: tuple[float, float] = (1.0, 1.0)
    ucb_c: float = Field(default=1.0, ge=0.0, le=100.0)
    contexts: bool = Field(default=True, description="learn per request context, backing off to domain and global")
    backoff_weight: float = Field(default=10.0, ge=0.1, le=1e6,
                                  description="requests of evidence a level borrows from the level above it")
    compute_bound_tokens: float = Field(default=256.0, gt=0.0, le=1e7,
                                        description="tokens per forward where a step turns compute-bound")

    @model_validator(mode="after")
    def _prior_positive(self) -> Learning:
        if self.prior_acceptance[0] <= 0 or self.prior_acceptance[1] <= 0:
            raise ValueError("prior_acceptance must be two positive numbers")
        return self


@dataclass(frozen=True, slots=True)
class PoolState:
    """What the gateway currently knows about one pool (from health checks, `Info` and `Load`)."""

    healthy: bool
    running: int = 0
    waiting: int = 0
    max_running: int = 0
    endpoints: int = 0
    speculative: bool = True  # False when every endpoint's engine kind never drafts (`ar`)
    draft_now: float | None = None  # drafts per step D-Cut keeps now (kept ratio x block); None: D-Cut off

    @property
    def queue_factor(self) -> float:
        return 1.0 + self.waiting / max(self.max_running, 1) if self.waiting > 0 else 1.0

    @property
    def batch(self) -> float:
        """Requests decoding per endpoint."""
        return self.running / max(self.endpoints, 1)


@dataclass(frozen=True, slots=True)
class Shrunk:
    """A pool's estimate for one request after back-off over its levels."""

    a: float  # Beta posterior of the acceptance rate
    b: float
    draft_len: float  # drafts per step
    step_ms: float  # decode time per step
    n: float  # the most requests a level below the top one holds (the top's when alone): `min_samples` gates it


def _blend(x: float | None, w: float, raw: float, n: float, cap: float) -> tuple[float, float]:
    if x is None:
        return raw, n
    w = min(w, cap)
    return (w * x + n * raw) / (w + n), w + n


def shrink(cells: Sequence[CellStats | None], learning: Learning) -> Shrunk | None:
    """Back-off over `cells`, most general first (None or empty levels are skipped); None without
    any observed step time."""
    a, b = learning.prior_acceptance
    epr = learning.evidence_per_request
    cap_ab, cap_n = learning.backoff_weight * epr, learning.backoff_weight
    k: float | None = None
    step: float | None = None
    wk = ws = 0.0
    below_top = False
    for c in cells:
        if c is None or c.n <= 0:
            continue
        rate = c.acceptance_rate
        if rate is not None:
            if below_top:  # the levels above are this level's prior, worth at most cap_ab
                s, m = min(a + b, cap_ab), a / (a + b)
                a, b = m * s, (1.0 - m) * s
            below_top = True
            rate = min(1.0, max(0.0, rate))
            e = c.n * epr
            a, b = a + rate * e, b + (1.0 - rate) * e
        dl, sm = c.draft_len, c.step_ms
        if dl is not None:
            k, wk = _blend(k, wk, dl, c.n, cap_n)
        if sm is not None and sm > 0:
            step, ws = _blend(step, ws, sm, c.n, cap_n)
    if step is None:
        return None
    gated = cells[1:] if len(cells) > 1 else cells
    n = max((c.n for c in gated if c is not None), default=0.0)
    return Shrunk(a, b, k or 0.0, step, n)


def pool_estimate(stats: Mapping[tuple[str, str], CellStats], levels: Sequence[str], pool: str,
                  learning: Learning) -> Shrunk | None:
    """The shrunk estimate of `pool` over `levels` (most specific first, as `level_keys` gives them)."""
    return shrink([stats.get((lvl, pool)) for lvl in reversed(levels)], learning)


def goodput(est: Shrunk, state: PoolState | None, learning: Learning, rng: random.Random | None) -> float:
    """Expected output tokens/s of one request (module docstring). With `rng` (Thompson) the
    acceptance rate is sampled from its posterior; without it the posterior mean (or the UCB bound
    for `method="ucb"`) is used."""
    a, b = est.a, est.b
    if learning.method == "thompson" and rng is not None:
        alpha = rng.betavariate(a, b)
    elif learning.method == "ucb":
        mean = a / (a + b)
        var = a * b / ((a + b) ** 2 * (a + b + 1.0))
        alpha = min(1.0, mean + learning.ucb_c * math.sqrt(var))
    else:
        alpha = a / (a + b)
    k = est.draft_len
    batch, queue = 0.0, 1.0
    if state is not None:
        if not state.speculative:
            k = 0.0
        elif state.draft_now is not None:
            k = min(k, max(0.0, state.draft_now))
        batch, queue = state.batch, state.queue_factor
    step = est.step_ms * (1.0 + batch * (1.0 + k) / learning.compute_bound_tokens)
    return (1.0 + k * alpha) * 1000.0 / step / queue


def expected_goodput(
    cell: CellStats,
    state: PoolState | None,
    learning: Learning,
    rng: random.Random | None,
) -> float | None:
    """Expected output tokens/s of one request from one cell alone; `None` without a step time."""
    est = shrink([cell], learning)
    return None if est is None else goodput(est, state, learning, rng)
