"""router/readiness.py, the pure functions: which domains a policy leaves without a pool, and the
`/readyz` verdict from classifier, pools, policy and Redis."""

from __future__ import annotations

from router.readiness import assess, domain_pools, routable, unservable
from router.routing.estimate import PoolState
from router.routing.policy import Policy, default_policy

UP, DOWN = PoolState(healthy=True, endpoints=1), PoolState(healthy=False)
POLICY = default_policy(["mtp", "dfly"])


def verdict(pools: dict[str, PoolState], policy: Policy = POLICY, *, classifier: str | None = None,
            redis: bool | None = True) -> tuple[str, list[str]]:
    r = assess(classifier_error=classifier, pools=pools, policy=policy, redis_configured=redis is not None,
               redis_ok=bool(redis))
    return r.status, r.reasons


def test_domain_pools_follow_decide() -> None:
    p = POLICY.model_copy(update={"pins": {"math": "mtp"}})
    assert domain_pools(p, "math") == ["mtp", "dfly"]  # pin, default, then the fallback order
    assert domain_pools(p, "code") == ["dfly", "mtp"]
    assert routable(p.model_copy(update={"drained": ["mtp"]}), ["mtp", "dfly"]) == ["dfly"]


def test_unservable() -> None:
    assert unservable(POLICY, ["mtp", "dfly"]) == []
    assert unservable(POLICY.model_copy(update={"drained": ["dfly"]}), ["mtp", "dfly"]) == []
    ghost = Policy(pools=["ghost"], defaults={d: "ghost" for d in ("chat", "code", "math")}, safe_pool="ghost")
    [msg] = unservable(ghost, ["mtp", "dfly"])
    assert "chat, code, math" in msg and "ghost" in msg
    phantom = POLICY.model_copy(update={"pools": ["mtp", "dfly", "phantom"], "drained": ["mtp", "dfly"]})
    assert unservable(phantom, ["mtp", "dfly"])  # the only undrained pool is not configured here
    assert unservable(POLICY, []) != []


def test_assess() -> None:
    assert verdict({"mtp": UP, "dfly": UP}) == ("ready", [])
    assert verdict({"mtp": UP, "dfly": UP}, redis=None) == ("ready", [])  # no Redis configured: fine
    status, why = verdict({"mtp": UP, "dfly": DOWN})
    assert status == "degraded" and "dfly" in why[0]
    status, why = verdict({"mtp": UP, "dfly": UP}, redis=False)
    assert status == "degraded" and "redis" in why[0]
    assert verdict({"mtp": DOWN, "dfly": DOWN})[0] == "not ready"
    assert verdict({"mtp": DOWN, "dfly": DOWN})[1][0] == "no healthy pool"
    # healthy, but the policy sends nothing there
    status, why = verdict({"mtp": UP, "dfly": DOWN}, POLICY.model_copy(update={"drained": ["mtp"]}))
    assert status == "not ready" and why[0] == "no healthy pool"
    status, why = verdict({"mtp": UP, "dfly": UP}, classifier="FileNotFoundError: artifact")
    assert status == "not ready" and "classifier" in why[0]
    ghost = Policy(pools=["ghost"], defaults={d: "ghost" for d in ("chat", "code", "math")}, safe_pool="ghost")
    status, why = verdict({"mtp": UP, "dfly": UP}, ghost)
    assert status == "not ready" and "no pool" in why[0]
