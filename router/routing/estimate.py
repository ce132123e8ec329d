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
    step(b) = step_ms * (1 + b * (1 + k_now) / C),  b = running per endpoint
    goodput = (1 + k_now * alpha) * 1000 / step(b) / (1 + waiting / max_running)

`1 + k * alpha` is the mean accepted length in expectation. The batch term says that verifying
`k + 1` tokens per request is free while a forward is memory-bound and costs its share once the
batch's tokens per forward approach C: at a large batch a speculative pool's advantage falls toward
`(1 + k alpha) / (1 + k) < 1`, and a pool that does not speculate wins. C is the pool's own figure,
measured by its workers at startup (`InfoResponse.compute_bound_tokens`, engines/forward_cost.py:
about 15 tokens on a 2-core CPU, hundreds on a GPU); `Learning.compute_bound_tokens` stands in for
pools that do not report one (vLLM).
`step_ms` is the observed step time, taken as the light-load one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from specroute.contracts.feedback import CellStats

# knobs added with the v2 statistics and since: left out of the stored document while at their defaults,
# so a gateway that does not know them (the document forbids unknown fields) still reads a new one
V2_LEARNING_FIELDS = ("contexts", "backoff_weight", "compute_bound_tokens", "warmup_exploration",
                      "drift_window_s", "drift_ratio", "drift_min_requests")


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
    warmup_exploration: float = Field(default=0.25, ge=0.0, le=1.0,
                                      description="exploration rate while a candidate pool lacks min_samples "
                                                  "requests of evidence in the request's domain")
    compute_bound_tokens: float = Field(default=256.0, gt=0.0, le=1e7,
                                        description="tokens per forward where a step turns compute-bound, for pools whose "
                                                    "workers do not report their own measurement")
    drift_window_s: float = Field(default=60.0, ge=0.0, le=600.0,
                                  description="change detection (router/routing/drift.py): how far back the newest evidence "
                                              "may reach when it is compared with the older; 0 turns it off")
    drift_ratio: float = Field(default=1.5, gt=1.0, le=100.0,
                               description="tokens per step of recent and older evidence this far apart mark a change")
    drift_min_requests: float = Field(default=10.0, ge=1.0, le=1e6,
                                      description="requests each side needs before a change can be marked")

    @model_serializer(mode="wrap")
    def _omit_v2_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in V2_LEARNING_FIELDS:
            if name in data and data[name] == type(self).model_fields[name].default:
                del data[name]
        return data

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
    # tokens per forward where the pool's steps turn compute-bound, as its workers measured it
    # (InfoResponse.compute_bound_tokens); None: not reported, `Learning.compute_bound_tokens` applies
    compute_bound_tokens: float | None = None

    @property
    def queue_factor(self) -> float:
        return 1.0 + self.waiting / max(self.max_running, 1) if self.waiting > 0 else 1.0

    @property
    def batch(self) -> float:
        """Requests decoding per endpoint."""
        return self.running / max(self.endpoints, 1)


class Shrunk(NamedTuple):
    """A pool's estimate for one request after back-off over its levels (a tuple: built per pool
    per request)."""

    a: float  # Beta posterior of the acceptance rate
    b: float
    draft_len: float  # drafts per step
    step_ms: float  # decode time per step
    n: float  # the most requests a level below the top one holds (the top's when alone): `min_samples` gates it


def shrink(cells: Sequence[CellStats | None], learning: Learning) -> Shrunk | None:
    """Back-off over `cells`, most general first (None or empty levels are skipped); None without
    any observed step time. (On the request path: plain arithmetic, no property calls.)"""
    a, b = learning.prior_acceptance
    epr = learning.evidence_per_request
    cap_ab, cap_n = learning.backoff_weight * epr, learning.backoff_weight
    k = step = -1.0  # -1: nothing observed yet
    wk = ws = 0.0
    below_top = False
    n_gate = 0.0
    last = len(cells) - 1
    for i, c in enumerate(cells):
        if c is None:
            continue
        n = c.n
        if (i > 0 or last == 0) and n > n_gate:
            n_gate = n
        if n <= 0:
            continue
        if c.drafted > 0:
            if below_top:  # the levels above are this level's prior, worth at most cap_ab
                s = a + b
                m = a / s
                if s > cap_ab:
                    s = cap_ab
                a, b = m * s, (1.0 - m) * s
            below_top = True
            rate = c.accepted / c.drafted
            rate = 0.0 if rate < 0.0 else 1.0 if rate > 1.0 else rate
            e = n * epr
            a, b = a + rate * e, b + (1.0 - rate) * e
        steps = c.steps
        if steps > 0:
            dl = c.drafted / steps
            if k < 0:
                k, wk = dl, n
            else:
                w = wk if wk < cap_n else cap_n
                k, wk = (w * k + n * dl) / (w + n), w + n
            sm = c.decode_ms / steps
            if sm > 0:
                if step < 0:
                    step, ws = sm, n
                else:
                    w = ws if ws < cap_n else cap_n
                    step, ws = (w * step + n * sm) / (w + n), w + n
    if step < 0:
        return None
    return Shrunk(a, b, k if k > 0 else 0.0, step, n_gate)


def pool_estimate(stats: Mapping[tuple[str, str], CellStats], levels: Sequence[str], pool: str,
                  learning: Learning) -> Shrunk | None:
    """The shrunk estimate of `pool` over `levels` (most specific first, as `level_keys` gives them)."""
    get = stats.get
    return shrink([get((lvl, pool)) for lvl in reversed(levels)], learning)


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
    batch, queue, bound = 0.0, 1.0, learning.compute_bound_tokens
    if state is not None:
        if not state.speculative:
            k = 0.0
        elif state.draft_now is not None:
            k = min(k, max(0.0, state.draft_now))
        batch, queue = state.batch, state.queue_factor
        if state.compute_bound_tokens:
            bound = state.compute_bound_tokens
    step = est.step_ms * (1.0 + batch * (1.0 + k) / bound)
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
