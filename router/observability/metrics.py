"""Gateway Prometheus metrics (names fixed by ARCHITECTURE.md), on a per-app registry.

Labels are bounded: domain (classifier labels + unknown), pool (configured pools), status (HTTP
class), reason (router.routing.policy.REASONS). No per-user or per-request labels.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

FAST_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """`metric.labels(*values)` memoised: the request path looks its children up in a dict instead of
    paying for prometheus_client's validation and lock on every request (label sets are bounded)."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, key_names: bool = False) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.key_names = key_names
        r = self.registry
        self.requests = Counter(
            "specroute_requests_total", "Finished gateway requests", ["domain", "pool", "status"], registry=r
        )
        self.route_decisions = Counter(
            "specroute_route_decisions_total", "Routing decisions", ["domain", "pool", "reason"], registry=r
        )
        self.classify_seconds = Histogram(
            "specroute_classify_seconds", "Classifier latency", buckets=FAST_BUCKETS, registry=r
        )
        self.overhead_seconds = Histogram(
            "specroute_overhead_seconds", "Gateway time excluding the worker call", buckets=FAST_BUCKETS,
            registry=r,
        )
        self.ttft_seconds = Histogram(
            "specroute_ttft_seconds", "Time to first token seen by the gateway", ["pool"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.itl_seconds = Histogram(
            "specroute_itl_seconds", "Inter-chunk latency while streaming", ["pool"], buckets=FAST_BUCKETS + (5.0,),
            registry=r,
        )
        self.pool_mean_accepted_length = Gauge(
            "specroute_pool_mean_accepted_length", "Decayed mean accepted length per domain x pool",
            ["domain", "pool"], registry=r,
        )
        self.learning_shifts = Counter(
            "specroute_learning_shifts_total",
            "Changes detected in a domain x pool's statistics (then learned from on the evidence since)",
            ["domain", "pool"], registry=r,
        )
        self.fallbacks = Counter(
            "specroute_fallbacks_total", "Requests moved to another endpoint or pool", ["from", "to", "reason"],
            registry=r,
        )
        self.redis_errors = Counter("specroute_redis_errors_total", "Failed Redis operations", registry=r)
        self.policy_version = Gauge("specroute_policy_version", "Version of the applied policy", registry=r)
        self.pool_healthy_endpoints = Gauge(
            "specroute_pool_healthy_endpoints", "Endpoints that can take requests", ["pool"], registry=r
        )
        self.admin_auth_failures = Counter(
            "specroute_admin_auth_failures_total", "Admin API requests refused for a missing or wrong token",
            registry=r,
        )
        self.snapshot_age_seconds = Gauge(
            "specroute_snapshot_age_seconds", "Age of the statistics snapshot", registry=r
        )

        # named API keys (router/keys/ring.py): key names are operator-defined and bounded (router.keys.ring.MAX_KEYS)
        self.key_requests = Counter(
            "specroute_key_requests_total", "Finished completion requests per API key", ["key", "status"], registry=r
        )
        self.rate_limited = Counter(
            "specroute_rate_limited_total", "Requests refused by a key's rate limit", ["key", "limit"], registry=r
        )
        self.rate_limit_fail_open = Counter(
            "specroute_rate_limit_fail_open_total", "Requests admitted unchecked because Redis was unavailable",
            registry=r,
        )

        self.migrations = Counter(
            "specroute_migrations_total", "Streams continued on another worker after theirs failed",
            ["from_pool", "to_pool"], registry=r)
        self.conversation_routes = Counter(
            "specroute_conversation_routes_total",
            "Turns of a known conversation: kept on their worker's pool (stay) or moved (gain, pin, unavailable)",
            ["pool", "outcome"], registry=r)
        self.shadow_decisions = Counter(
            "specroute_shadow_decisions_total", "Decisions of the shadow policy beside the live one (not served)",
            ["live_pool", "shadow_pool"], registry=r)
        # memoised children of the labelled metrics the request path touches
        self.requests_by = Children(self.requests)
        self.route_decisions_by = Children(self.route_decisions)
        self.ttft_by = Children(self.ttft_seconds)
        self.itl_by = Children(self.itl_seconds)
        self.fallbacks_by = Children(self.fallbacks)
        self.key_requests_by = Children(self.key_requests)
        self.rate_limited_by = Children(self.rate_limited)
        self.conversation_routes_by = Children(self.conversation_routes)
        self.shadow_decisions_by = Children(self.shadow_decisions)

    def key_label(self, name: str) -> str:
        """An API key's `key` label: its name only when the operator opts in (`metrics_key_names`;
        `/metrics` is unauthenticated), else `redacted`."""
        return name if self.key_names else "redacted"

    def render(self) -> bytes:
        return generate_latest(self.registry)
