"""What this gateway can serve right now, decided from what it knows (pure functions, no I/O).

- `unservable(policy, configured)`: the domains a policy would serve by no pool (every pool it could
  route them to is unconfigured here or drained). The admin API refuses such a policy unless forced.
- `assess(...)`: the `/readyz` verdict. `ready`; `degraded` (still serving, but a pool is down or
  Redis is unreachable: the policy and statistics come from the last snapshot); or `not ready`
  (nothing can be served: no classifier, no usable pool in the policy, or none of them healthy).
  A degraded gateway answers 200 so a load balancer keeps it; only `not ready` is a 503.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from router.routing.estimate import PoolState
from router.routing.policy import WILDCARD, Policy, fallback_order

Status = Literal["ready", "degraded", "not ready"]


def domain_pools(policy: Policy, domain: str) -> list[str]:
    """Every pool `decide` may send a request of `domain` to, in order: its pin, its default, then
    the fallback order (which ends with every pool of the policy)."""
    first = [p for p in (policy.pins.get(domain), policy.pins.get(WILDCARD), policy.defaults.get(domain)) if p]
    return list(dict.fromkeys([*first, *fallback_order(policy)]))


def routable(policy: Policy, configured: Sequence[str], domain: str | None = None) -> list[str]:
    """The pools of `policy` (for `domain`, or any domain) that are configured here and not drained."""
    conf, drained = set(configured), set(policy.drained)
    pools = domain_pools(policy, domain) if domain is not None else fallback_order(policy)
    return [p for p in pools if p in conf and p not in drained]


def unservable(policy: Policy, configured: Sequence[str]) -> list[str]:
    """Why `policy` would answer some domain's requests with 503 on a gateway with the `configured`
    pools, whatever their health (empty: every domain has a pool)."""
    dead = [d for d in policy.domains if not routable(policy, configured, d)]
    if not dead:
        return []
    return [f"domain(s) {', '.join(dead)} would be served by no pool: none of the policy's pools "
            f"{policy.pools} is configured on this gateway ({sorted(configured)}) and undrained "
            f"(drained: {policy.drained})"]


@dataclass(frozen=True, slots=True)
class Readiness:
    status: Status
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the gateway should get traffic (ready or degraded)."""
        return self.status != "not ready"

    @property
    def reason(self) -> str:
        return self.reasons[0] if self.reasons else "ok"


def assess(*, classifier_error: str | None, pools: Mapping[str, PoolState], policy: Policy,
           redis_configured: bool, redis_ok: bool) -> Readiness:
    """The gateway's readiness from its classifier, its pools' health, its policy and Redis
    (`classifier_error` None = the classifier is loaded)."""
    down: list[str] = []
    if classifier_error is not None:
        down.append(f"classifier not loaded ({classifier_error})")
    bad = unservable(policy, list(pools))
    if bad:
        down += bad
    elif not any(pools[p].healthy for p in routable(policy, list(pools))):
        down.append("no healthy pool")
    degraded: list[str] = []
    sick = [p for p, st in pools.items() if not st.healthy]
    if sick:
        degraded.append(f"pool(s) {', '.join(sick)} unhealthy: their requests fall back to the other pools")
    if redis_configured and not redis_ok:
        degraded.append("redis unreachable: routing on the last policy/statistics snapshot, policy writes fail")
    if down:
        return Readiness("not ready", down + degraded)
    return Readiness("degraded", degraded) if degraded else Readiness("ready")
