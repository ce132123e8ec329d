"""Shadow policies, pure: a candidate policy decides beside the live one on the same request, and
each decision's pool is scored with the same estimator, so the two policies' predicted goodput can be
compared on live traffic without serving a single request by the candidate.

    predicted(pool) = goodput(shrunk estimate of `pool` over the request's context levels, its state now)

with the acceptance rate at its posterior mean (router/routing/estimate.py `goodput` without an RNG),
the live policy's learning settings for both sides (what differs is only the pool each policy
chooses), and `None` where the pool has no observed step time yet. The shadow decision draws from its
own RNG, so the live decisions are the same with or without a shadow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from router.routing.decide import Decision, StatsSnapshot
from router.routing.estimate import Learning, PoolState, goodput, pool_estimate
from specroute.contracts.context import level_keys


@dataclass(frozen=True, slots=True)
class Comparison:
    domain: str
    live_pool: str | None
    shadow_pool: str | None
    live_goodput: float | None   # predicted tokens/s of the live decision's pool
    shadow_goodput: float | None

    @property
    def agree(self) -> bool:
        return self.live_pool == self.shadow_pool


def predicted_goodput(pool: str | None, decision: Decision, stats: StatsSnapshot,
                      states: Mapping[str, PoolState], learning: Learning) -> float | None:
    """The expected goodput of `pool` for the request `decision` was made for (posterior mean)."""
    if pool is None:
        return None
    levels = level_keys(decision.domain, decision.context) if learning.contexts else (decision.domain,)
    est = pool_estimate(stats, levels, pool, learning)
    if est is None:
        return None
    mean = learning if learning.method == "thompson" else learning.model_copy(update={"method": "thompson"})
    return goodput(est, states.get(pool), mean, None)


def compare(live: Decision, shadow: Decision, stats: StatsSnapshot, states: Mapping[str, PoolState],
            learning: Learning) -> Comparison:
    """Both decisions' pools and their predicted goodput (the same estimator for each)."""
    g_live = predicted_goodput(live.pool, live, stats, states, learning)
    g_shadow = g_live if shadow.pool == live.pool else predicted_goodput(shadow.pool, live, stats, states, learning)
    return Comparison(live.domain, live.pool, shadow.pool, g_live, g_shadow)
