"""Per-request acceptance prediction: per pool, the acceptance rate of each statistics level (a domain
or a context key) in the feedback records, and a ridge regression from the request's features
(router/routing/features.py) to how far one request's acceptance lies from its level's; the document
that holds both, its fit from feedback records, and how the decision combines it with the learned
statistics. Pure: no I/O, no clock (the fit's time is passed in), plain Python (a dot product per
pool on the request path).

Model, per speculative pool p, for a request with features x whose most specific level known to the
model is L:

    alpha_p(x) = clip(mu_p(L) + delta_p(x), 0.01, 0.99),   delta_p(x) = b_p + w_p . x

`mu_p(L)` is the pooled acceptance (accepted / drafted) of the training records of L (levels with at
least `MIN_LEVEL_RECORDS`; the global level `*` always, once any); `delta_p` is fitted by ridge on
each record's acceptance minus its level's (weight: its drafted tokens; penalty `ridge` on every
weight but the bias), so it says only what the features add to the context buckets.

Combination (`with_prediction`): the learned estimate of a pool for the request's context is a Beta
with mean m_L over e = n x `evidence_per_request` pseudo-counts of evidence. The prediction is its
prior, worth `prior_weight` requests (w pseudo-counts): the decision's mean is

    m = (w * alpha_p(x) + e * (m_L + delta_p(x))) / (w + e)

Without evidence the prediction stands alone (so the decision may trust a pool the predictor knows
before this gateway has seen `min_samples` requests of it: router/routing/decide.py); as evidence grows
the learned acceptance takes over, and the prediction keeps only what it says about this request
against its level, so a drifted or broken drafter is followed by the statistics while requests of
one context are still told apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from router.routing.estimate import Learning, Shrunk
from router.routing.features import FEATURE_VERSION, FEATURES
from specroute.contracts.context import GLOBAL_LEVEL
from specroute.contracts.feedback import MAX_FEATURES

MIN_ALPHA, MAX_ALPHA = 0.01, 0.99
MIN_LEVEL_RECORDS = 5
MAX_LEVELS = 512          # level means kept per pool (the most trained first)
MAX_POOL_MODELS = 32


class PoolModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bias: float
    weights: list[float] = Field(max_length=MAX_FEATURES)
    records: int = Field(ge=0, description="feedback records it was fitted on")
    level_means: dict[str, float] = Field(default_factory=dict, max_length=MAX_LEVELS,
                                          description="level (domain, context key or '*') -> pooled acceptance of its records")

    @model_validator(mode="after")
    def _finite(self) -> PoolModel:
        if not all(math.isfinite(x) for x in (self.bias, *self.weights, *self.level_means.values())):
            raise ValueError("predictor weights must be finite")
        return self


class Predictor(BaseModel):
    """The predictor's document (stored in Redis, `{specroute}:predictor`, versioned by the store)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=0, ge=0, description="set by the store")
    feature_version: int = FEATURE_VERSION
    features: list[str] = Field(default_factory=lambda: list(FEATURES), max_length=MAX_FEATURES)
    pools: dict[str, PoolModel] = Field(default_factory=dict, max_length=MAX_POOL_MODELS)
    prior_weight: float = Field(default=30.0, ge=0.0, le=1e6, description="requests of evidence a prediction is worth")
    ridge: float = Field(default=30.0, ge=0.0)
    records: int = Field(default=0, ge=0)
    trained_at: float = Field(default=0.0, ge=0.0, description="when it was fitted (s since the epoch)")

    @model_validator(mode="after")
    def _shapes(self) -> Predictor:
        for p, m in self.pools.items():
            if len(m.weights) != len(self.features):
                raise ValueError(f"pools[{p}]: {len(m.weights)} weights for {len(self.features)} features")
        return self

    def usable(self) -> bool:
        """Whether this gateway computes the features it was trained on."""
        return self.feature_version == FEATURE_VERSION and tuple(self.features) == FEATURES and bool(self.pools)


def deviation(model: PoolModel, x: Sequence[float]) -> float:
    """How far a request with features `x` (`FEATURES` order) lies from its level's acceptance."""
    z = model.bias
    for w, v in zip(model.weights, x, strict=False):
        z += w * v
    return z


def level_mean(model: PoolModel, levels: Sequence[str]) -> float | None:
    """The pooled acceptance of the most specific of `levels` (most specific first) the model has."""
    for lvl in levels:
        m = model.level_means.get(lvl)
        if m is not None:
            return m
    return None


def predict(model: PoolModel, x: Sequence[float], levels: Sequence[str] = (GLOBAL_LEVEL,)) -> float:
    """Predicted acceptance rate of one request (features `x`, statistics `levels` most specific first)."""
    base = level_mean(model, levels)
    z = (0.5 if base is None else base) + deviation(model, x)
    return MIN_ALPHA if z < MIN_ALPHA else MAX_ALPHA if z > MAX_ALPHA else z


def with_prediction(est: Shrunk, model: PoolModel, x: Sequence[float], levels: Sequence[str], prior_weight: float,
                    learning: Learning) -> Shrunk:
    """`est` with the request's predicted acceptance as its prior (module docstring)."""
    epr = learning.evidence_per_request
    w, e = prior_weight * epr, est.n * epr
    if w <= 0:
        return est
    s = est.a + est.b
    delta = deviation(model, x)
    m = (w * predict(model, x, levels) + e * (est.a / s + delta)) / (w + e)
    m = MIN_ALPHA if m < MIN_ALPHA else MAX_ALPHA if m > MAX_ALPHA else m
    s = max(s, e) + w
    return Shrunk(m * s, (1.0 - m) * s, est.draft_len, est.step_ms, est.n)


# ------------------------------------------------------------------------------------------------
# fitting


@dataclass(frozen=True, slots=True)
class Sample:
    """One feedback record as the fit reads it."""

    pool: str
    features: tuple[float, ...]
    drafted: int
    accepted: int
    levels: tuple[str, ...] = ()   # the statistics levels the record updated, most specific first


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b (Gaussian elimination with partial pivoting; `a` symmetric positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        d = m[c][c]
        if abs(d) < 1e-12:
            continue
        for r in range(c + 1, n):
            f = m[r][c] / d
            if f:
                row, top = m[r], m[c]
                for k in range(c, n + 1):
                    row[k] -= f * top[k]
    x = [0.0] * n
    for c in range(n - 1, -1, -1):
        d = m[c][c]
        s = m[c][n] - sum(m[c][k] * x[k] for k in range(c + 1, n))
        x[c] = s / d if abs(d) >= 1e-12 else 0.0
    return x


def fit_pool(samples: Sequence[Sample], ridge: float) -> PoolModel | None:
    """The level rates and the ridge fit of one pool's samples (None without a drafted token)."""
    rows = [s for s in samples if s.drafted > 0 and len(s.features) == len(FEATURES)]
    if not rows:
        return None
    sums: dict[str, list[float]] = {}
    for s in rows:
        for lvl in (*s.levels, GLOBAL_LEVEL):
            acc = sums.setdefault(lvl, [0.0, 0.0, 0.0])
            acc[0] += min(s.accepted, s.drafted)
            acc[1] += s.drafted
            acc[2] += 1
    kept = sorted((lvl for lvl, v in sums.items() if v[2] >= MIN_LEVEL_RECORDS or lvl == GLOBAL_LEVEL),
                  key=lambda lvl: (lvl != GLOBAL_LEVEL, -sums[lvl][2], lvl))
    means = {lvl: sums[lvl][0] / sums[lvl][1] for lvl in kept[:MAX_LEVELS]}
    d = len(FEATURES) + 1                      # bias last
    xtx = [[0.0] * d for _ in range(d)]
    xty = [0.0] * d
    total = 0.0
    for s in rows:
        wgt = float(s.drafted)
        base = next((means[lvl] for lvl in s.levels if lvl in means), means[GLOBAL_LEVEL])
        y = min(1.0, max(0.0, s.accepted / s.drafted)) - base
        x = (*s.features, 1.0)
        for i in range(d):
            wx = wgt * x[i]
            if wx:
                xty[i] += wx * y
                r = xtx[i]
                for j in range(i, d):
                    r[j] += wx * x[j]
        total += wgt
    for i in range(d):
        for j in range(i):
            xtx[i][j] = xtx[j][i]
    # the penalty scales with the evidence's weight per record, so `ridge` means the same at any traffic
    lam = ridge * total / len(rows)
    for i in range(d - 1):
        xtx[i][i] += lam
    beta = _solve(xtx, xty)
    return PoolModel(bias=beta[-1], weights=beta[:-1], records=len(rows), level_means=means)


def fit(samples: Iterable[Sample], *, ridge: float = 30.0, prior_weight: float = 30.0, now: float = 0.0) -> Predictor:
    """A predictor for every pool with drafted samples."""
    by_pool: dict[str, list[Sample]] = {}
    for s in samples:
        by_pool.setdefault(s.pool, []).append(s)
    pools: dict[str, PoolModel] = {}
    for p in sorted(by_pool)[:MAX_POOL_MODELS]:
        m = fit_pool(by_pool[p], ridge)
        if m is not None:
            pools[p] = m
    return Predictor(pools=pools, prior_weight=prior_weight, ridge=ridge,
                     records=sum(m.records for m in pools.values()), trained_at=now)


def predictions(predictor: Predictor | None, features: Sequence[float],
                pools: Iterable[str]) -> Mapping[str, PoolModel]:
    """The pool models of `pools` that apply to a request with `features` (none when the predictor is
    missing, of other features, or the request has no complete vector)."""
    if predictor is None or len(features) != len(FEATURES) or not predictor.usable():
        return {}
    return {p: m for p in pools if (m := predictor.pools.get(p)) is not None}
