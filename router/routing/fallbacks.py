"""Policy fallbacks as `specroute_fallbacks_total{from,to,reason}`: when `decide` answers `fallback`
(or `no_healthy_pool`) because the pool the policy wanted is drained or down, the outage must show on
the same counter as the dispatcher's retries (router/workers/upstream.py), or the Grafana panel stays flat
while a whole pool is gone.

`intended_pool` names the pool the policy would have chosen (pin, safe pool of an uncertain request,
or the domain's default: the same precedence as `router.routing.decide.decide`, without canaries, exploration
and learning, which never pick an unavailable pool); pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.routing.decide import Decision
from router.routing.estimate import PoolState
from router.routing.policy import UNKNOWN_DOMAIN, WILDCARD, Policy

FALLBACK_REASONS = frozenset({"fallback", "no_healthy_pool"})


def intended_pool(policy: Policy, domain: str, uncertainty: float) -> str:
    pin = policy.pins.get(domain) or policy.pins.get(WILDCARD)
    if pin is not None:
        return pin
    if domain == UNKNOWN_DOMAIN or uncertainty > policy.uncertainty_threshold:
        return policy.safe_pool
    return policy.defaults.get(domain, policy.safe_pool)


def policy_fallback(d: Decision, policy: Policy, pools: Mapping[str, PoolState],
                    uncertainty: float) -> tuple[str, str, str] | None:
    """`(from, to, reason)` labels when `d` is a policy fallback, else None. `reason` says why the
    intended pool was skipped: `drained`, `pool_down` (no available endpoint) or `unknown_pool` (not
    configured on this gateway)."""
    if d.reason not in FALLBACK_REASONS:
        return None
    frm = intended_pool(policy, d.domain, uncertainty)
    st = pools.get(frm)
    if frm in policy.drained:
        why = "drained"
    elif st is None:
        why = "unknown_pool"
    else:
        why = "pool_down"
    return frm, d.pool or "none", why
