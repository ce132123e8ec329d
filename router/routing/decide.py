"""The routing decision, pure: which pool serves one request.

`decide(...)` maps (classifier probabilities and uncertainty, per domain x pool statistics, pool
health and load, operator policy, an injected RNG) to a `Decision(pool, domain, reason)`. It does no
I/O and reads no clock, so it is deterministic given the RNG and unit-testable.

Order of precedence (first match wins):

1. `pin`        operator pin for the domain (or `"*"`) - always wins over learning.
2. `uncertain`  classifier uncertainty above `uncertainty_threshold` -> `safe_pool`.
3. `canary`     a traffic share for a canary pool (per domain or all domains).
4. `explore`    with probability `exploration_rate`, a random other candidate (feeds the statistics);
                while a candidate lacks `min_samples` requests of evidence in the domain, at
                `learning.warmup_exploration` instead, to that candidate (fast learning after a reset;
                `exploration_rate` 0 turns both off). A pool that does not speculate (`ar`) has no
                acceptance to learn per domain: its evidence is counted over every domain.
5. `learned`    another candidate whose expected goodput beats the default pool's by
                `switch_margin` (Thompson sampling or UCB over decayed acceptance statistics; with
                an acceptance predictor, its estimate for this request is the prior of those
                statistics and counts as `prior_weight` requests of evidence: router/routing/predictor.py).
6. `default`    the domain's default pool.

Whenever the chosen pool is drained or unhealthy the decision walks `fallback_order(policy)` (the
policy's `fallback_order`, the safe pool, then every pool) and says `fallback`; with nothing
available the pool is `None` (`no_healthy_pool`).

Learning reads the statistics of the request's context (`RequestContext`, its domain filled in
here): full context, coarse context, domain and global levels, each shrunk toward the one above
(router/routing/estimate.py), so a sparse context follows its domain and a dense one stands on its own; a
domain x pool whose recent evidence contradicts its past is read on the evidence since the change
(router/routing/drift.py, applied to the snapshot before it gets here). The
expected goodput of a pool accounts for its current batch, whether it speculates at all (an `ar`
pool is a candidate like any other) and how much its D-Cut drafts now:

    goodput = (1 + k * alpha) * 1000 / (step_ms * (1 + b * (1 + k) / compute_bound_tokens))
              / (1 + waiting / max_running)

with `k` the draft length per step (after D-Cut; 0 for `ar`), `alpha` the acceptance rate (sampled
from a Beta posterior built from decayed counts), `step_ms` the observed decode time per step and
`b` the requests running per endpoint. The decision carries the request's context (its key goes to
the worker for the feedback record), and so do its features (router/routing/features.py: the prompt
part computed at admit, the classifier part here), which the predictor is trained from.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from router.routing.estimate import PoolState, goodput, pool_estimate
from router.routing.features import request_features
from router.routing.policy import UNKNOWN_DOMAIN, WILDCARD, Policy, fallback_order
from router.routing.predictor import Predictor, predictions, with_prediction
from specroute.contracts.context import GLOBAL_LEVEL, RequestContext, level_keys
from specroute.contracts.feedback import CellStats


@dataclass(frozen=True, slots=True)
class Decision:
    pool: str | None
    domain: str
    reason: str
    scores: dict[str, float] = field(default_factory=dict)
    # the request's context, its domain filled in when known (its `key` is "" without one)
    context: RequestContext = RequestContext()
    # the request's features (router/routing/features.py `FEATURES`; empty without its prompt part):
    # they go to the worker for the feedback record, which the predictor is trained from
    features: tuple[float, ...] = ()


# (level, pool) -> decayed stats; a level is a domain, a context key or "*" (specroute/contracts/context.py)
StatsSnapshot = Mapping[tuple[str, str], CellStats]


def top_domain(probabilities: Mapping[str, float]) -> str:
    best, best_p = UNKNOWN_DOMAIN, -math.inf
    for label, p in probabilities.items():
        if p > best_p:
            best, best_p = label, p
    return best


def decide(
    probabilities: Mapping[str, float],
    uncertainty: float,
    stats: StatsSnapshot,
    pools: Mapping[str, PoolState],
    policy: Policy,
    rng: random.Random,
    context: RequestContext | None = None,
    prompt_features: Sequence[float] = (),
    predictor: Predictor | None = None,
) -> Decision:
    """Choose a pool for one request. Pure: all inputs explicit, randomness from `rng`. `context`
    holds the request's buckets (its domain is the one chosen here); `prompt_features` the prompt
    part of its features (computed at admit) and `predictor` the acceptance predictor, whose
    per-request estimate is the prior of the learned statistics."""
    domain = top_domain(probabilities)
    features = request_features(prompt_features, probabilities, uncertainty)
    drained = set(policy.drained)
    learning = policy.learning
    base = context if context is not None else RequestContext()
    ctx = base.with_domain(domain) if context is not None and domain != UNKNOWN_DOMAIN else None

    def out(pool: str | None, reason: str, scores: dict[str, float] | None = None) -> Decision:
        return Decision(pool, domain, reason, scores if scores is not None else {}, ctx if ctx is not None else base,
                        features)

    def available(p: str) -> bool:
        st = pools.get(p)
        return p in policy.pools and p not in drained and st is not None and st.healthy

    def fallback() -> Decision:
        for p in fallback_order(policy):
            if available(p):
                return out(p, "fallback")
        return out(None, "no_healthy_pool")

    # 1. operator pins always win
    pin = policy.pins.get(domain) or policy.pins.get(WILDCARD)
    if pin is not None:
        return out(pin, "pin") if available(pin) else fallback()

    # 2. uncertain classification -> the safe pool
    if domain == UNKNOWN_DOMAIN or uncertainty > policy.uncertainty_threshold:
        if available(policy.safe_pool):
            return out(policy.safe_pool, "uncertain")
        return fallback()

    # 3. canaries
    if policy.canaries:
        r, acc = rng.random(), 0.0
        for c in policy.canaries:
            if c.domains and domain not in c.domains:
                continue
            acc += c.share
            if r < acc:
                if available(c.pool):
                    return out(c.pool, "canary")
                break

    default = policy.defaults.get(domain, policy.safe_pool)
    if learning.enabled:
        cands = [p for p in (policy.candidates.get(domain) or policy.pools) if available(p)]
        levels = level_keys(domain, ctx) if learning.contexts else (domain,)
        ests = {p: pool_estimate(stats, levels, p, learning) for p in cands}
        prior: dict[str, float] = {}   # requests of evidence the predictor's prior adds to a pool
        if predictor is not None:
            for p, model in predictions(predictor, features, cands).items():
                est, st = ests[p], pools.get(p)
                if est is not None and (st is None or st.speculative):
                    ests[p] = with_prediction(est, model, features, levels, predictor.prior_weight, learning)
                    prior[p] = predictor.prior_weight

        def evidence(p: str) -> float:
            """Requests of evidence on `p` that gate trusting it: in the domain (plus what the predictor's
            prior is worth, when it predicts `p`), or over every domain for a pool that does not speculate
            (its step rate is all there is to learn, and it is the same for chat, code and math: warming
            it up per domain only sends slow requests there)."""
            est, st = ests[p], pools.get(p)
            if est is None:
                return 0.0
            if st is not None and not st.speculative:
                top = stats.get((GLOBAL_LEVEL, p))
                return max(est.n, top.n if top is not None else 0.0)
            return est.n + prior.get(p, 0.0)
        # 4. exploration keeps every candidate's statistics fresh; a candidate without `min_samples`
        # requests of evidence in this domain is explored at the (higher) warm-up rate until it has them
        # (exploration_rate 0 turns all exploration off)
        rate = policy.exploration_rate
        unseen = [p for p in cands if p != default and evidence(p) < learning.min_samples]
        if unseen and rate > 0:
            rate = max(rate, learning.warmup_exploration)
        if len(cands) > 1 and rate > 0 and rng.random() < rate:
            others = unseen or [p for p in cands if p != default] or cands
            return out(rng.choice(others), "explore")
        # 5. exploitation: beat the default's expected goodput by a margin
        scores: dict[str, float] = {}
        sampler = rng if learning.method == "thompson" else None
        for p in cands:
            est = ests[p]
            if est is None or evidence(p) < learning.min_samples:
                continue
            scores[p] = goodput(est, pools.get(p), learning, sampler)
        if scores:
            best = max(scores, key=lambda p: scores[p])
            if available(default):
                default_score = scores.get(default)
                if (default_score is not None and best != default
                        and scores[best] > default_score * (1.0 + learning.switch_margin)):
                    return out(best, "learned", scores)
                return out(default, "default", scores)
            return out(best, "learned", scores)

    # 6. the default pool
    if available(default):
        return out(default, "default")
    return fallback()
