"""Worker Prometheus metrics (named like vLLM's, see ARCHITECTURE.md) on a per-worker registry."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric

from engines.requests import BatcherObserver, Handle, RequestStats
from specroute.contracts.stats import AcceptanceStats

SPEC = "specroute_spec_decode_"


class WorkerMetrics(BatcherObserver):
    """Counters updated from the batcher thread (prometheus-client is thread-safe)."""

    def __init__(self, registry: CollectorRegistry | None = None, max_positions: int = 32) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.num_drafts = Counter(SPEC + "num_drafts", "Draft rounds (requests x steps with drafts)", registry=r)
        self.num_draft_tokens = Counter(SPEC + "num_draft_tokens", "Draft tokens sent to verification",
                                        registry=r)
        self.num_accepted_tokens = Counter(SPEC + "num_accepted_tokens",
                                           "Draft tokens accepted (bonus excluded)", registry=r)
        self.per_pos = Counter(SPEC + "num_accepted_tokens_per_pos", "Accepted draft tokens by position",
                               ["position"], registry=r)
        self._pos = [self.per_pos.labels(position=str(i)) for i in range(max_positions)]
        self.running = Gauge("specroute_requests_running", "Requests holding a cache slot", registry=r)
        self.waiting = Gauge("specroute_requests_waiting", "Requests queued for a slot", registry=r)
        self.generation_tokens = Counter("specroute_generation_tokens", "Output tokens emitted", registry=r)
        self.kept_ratio = Histogram("specroute_dcut_kept_ratio", "Fraction of drafted tokens verified per step",
                                    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r)
        self.dcut_cut_steps = Counter("specroute_dcut_cut_steps", "Drafted steps where D-Cut left drafts unverified",
                                      registry=r)
        self.dcut_cut_drafts = Counter("specroute_dcut_cut_drafts",
                                       "Drafts D-Cut left unverified (within the rows' limits)", registry=r)
        self.requests = Counter("specroute_worker_requests", "Finished requests by finish reason",
                                ["finish_reason"], registry=r)
        self.redis_errors = Counter("specroute_redis_errors", "Feedback writes lost (Redis down or queue full)",
                                    registry=r)
        self.feedback_written = Counter("specroute_feedback_written", "Feedback records written to Redis",
                                        registry=r)

    # --- BatcherObserver ----------------------------------------------------------------------------
    def on_step(self, keep: Sequence[int], accepted: Sequence[int], kept_fraction: float | None) -> None:
        if kept_fraction is None:
            return
        rows = sum(1 for k in keep if k > 0)
        if rows:
            self.num_drafts.inc(rows)
        self.num_draft_tokens.inc(sum(keep))
        self.num_accepted_tokens.inc(sum(accepted))
        for a in accepted:
            for i in range(min(a, len(self._pos))):
                self._pos[i].inc()
        self.kept_ratio.observe(kept_fraction)

    def on_dcut_cut(self, drafts: int) -> None:
        self.dcut_cut_steps.inc()
        self.dcut_cut_drafts.inc(drafts)

    def on_tokens(self, n: int) -> None:
        if n:
            self.generation_tokens.inc(n)

    def on_load(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def on_finish(self, handle: Handle, stats: RequestStats, finish_reason: str) -> None:
        self.requests.labels(finish_reason=finish_reason or "unknown").inc()

    # --- backends that report a whole request's acceptance at its end (vLLM) ----------------------
    def on_request_acceptance(self, s: AcceptanceStats, rounds: int | None = None) -> None:
        """`rounds`: steps that verified drafts, where not every step did (vLLM's ngram); default `steps`."""
        if not s.steps:
            return
        self.num_drafts.inc(s.steps if rounds is None else rounds)
        self.num_draft_tokens.inc(s.drafted)
        self.num_accepted_tokens.inc(s.accepted)
        for i, c in enumerate(s.accepted_per_position[: len(self._pos)]):
            self._pos[i].inc(c)

    def serve(self, port: int, host: str = "127.0.0.1", with_default_registry: bool = False) -> int:
        registry: Any = self.registry
        if with_default_registry:
            registry = _Joined((self.registry, REGISTRY))
        server, _ = start_http_server(port, addr=host, registry=registry)
        return int(server.server_port)


class _Joined:
    """Several registries exposed as one (ours and prometheus-client's default, where vLLM registers)."""

    def __init__(self, registries: Sequence[Any]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        for r in self.registries:
            yield from r.collect()
