"""Opening a worker stream: pick an endpoint, start `Generate`, wait for its first chunk, and before
that first chunk retry elsewhere (another endpoint of the pool, then the next pool of the policy's
`fallback_order`).

Failures are domain errors (`UpstreamError` and its subclasses); the API layer (router/http/errors.py)
turns them into OpenAI error responses.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from router import affinity
from router.observability.metrics import Metrics
from router.workers.endpoint import Endpoint
from router.workers.pools import PoolManager
from specroute.v1 import engine_pb2

# worker failures where another endpoint may succeed (only retried before the first token)
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN,
     grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}
)
# failures that count against an endpoint's circuit breaker (the endpoint is sick, not the request)
ENDPOINT_FAILURES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
     grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)


class UpstreamError(Exception):
    """No worker stream could be opened for the request."""


class DeadlineExceeded(UpstreamError):
    """The request's deadline passed before a worker answered."""


class WorkerRejected(UpstreamError):
    """A worker refused the request itself (not retried: another worker would refuse it too)."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(details or code.name)
        self.code, self.details = code, details


class NoWorker(UpstreamError):
    """Every try failed (`code`/`details` of the last one), or there was nothing to try (`code` None)."""

    def __init__(self, code: grpc.StatusCode | None = None, details: str | None = None) -> None:
        super().__init__(details or (code.name if code is not None else "no healthy worker"))
        self.code, self.details = code, details


def record_rpc_failure(endpoint: Endpoint, exc: grpc.aio.AioRpcError) -> None:
    """Count a failed call against `endpoint`'s breaker when the endpoint, not the request, is sick."""
    code = exc.code()
    if code in ENDPOINT_FAILURES:
        endpoint.record_failure(exc.details() or code.name, connection=code == grpc.StatusCode.UNAVAILABLE)


@dataclass(slots=True)
class Upstream:
    """An open worker stream whose first chunk has arrived (so it is past the retry window)."""

    endpoint: Endpoint
    pool: str
    call: Any
    first: Any  # engine_pb2.GenerateChunk, or None when the worker sent nothing
    attempts: int
    worker_s: float = 0.0  # time spent waiting on the worker
    trial: bool = False  # the endpoint's half-open breaker trial (router/workers/pools.py)
    kind: str = ""  # the request's batch-affinity kind (router/routing/affinity.py), counted on its worker
    _closed: bool = False

    async def chunks(self, on_wait: Callable[[float], None] | None = None) -> AsyncIterator[Any]:
        """The stream's chunks, from the first to the final one (the one with `finish_reason`, after
        which the call's status is awaited); `on_wait` gets each wait for a further chunk, s."""
        chunk = self.first
        while chunk is not None:
            yield chunk
            if chunk.finish_reason:
                await self.finish()
                return
            t = time.perf_counter()
            try:
                nxt = await self.call.read()
            finally:
                wait = time.perf_counter() - t
                self.worker_s += wait
            if on_wait is not None:
                on_wait(wait)
            chunk = None if nxt is grpc.aio.EOF else nxt

    async def finish(self) -> None:
        """After the final chunk (the one with `finish_reason`): wait for the call's status instead of
        reading the end of the stream (one gRPC operation less); a failed status raises the call's
        `AioRpcError`, as that read would have."""
        t = time.perf_counter()
        try:
            if await self.call.code() != grpc.StatusCode.OK:
                await self.call.read()  # the call is over: this raises its error
        finally:
            self.worker_s += time.perf_counter() - t

    def failed(self, exc: grpc.aio.AioRpcError) -> None:
        record_rpc_failure(self.endpoint, exc)

    def close(self, ok: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.endpoint.release(self.trial, self.kind)
        if ok:
            self.endpoint.record_success()
        elif not self.call.done():
            self.call.cancel()


class Dispatcher:
    def __init__(self, pools: PoolManager, metrics: Metrics, max_attempts: int) -> None:
        self.pools = pools
        self.metrics = metrics
        self.max_attempts = max_attempts

    async def open(self, order: Sequence[str], req: engine_pb2.GenerateRequest, deadline: float,
                   metadata: tuple[tuple[str, str], ...] | None = None) -> Upstream:
        """Start the worker call and wait for its first chunk, trying the pools of `order` (the
        decision's pool first) and at most `max_attempts` endpoints in all (`metadata`: gRPC metadata
        of every try, e.g. the trace context)."""
        tried: set[Endpoint] = set()
        kind = affinity.kind_of(req.sampling.temperature)
        attempts = 0
        last: grpc.aio.AioRpcError | None = None
        chosen = prev_pool = order[0] if order else None
        for pool in order:
            while attempts < self.max_attempts:
                ep = self.pools.pick(pool, tried, kind)
                if ep is None:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded("request deadline exceeded before a worker answered")
                if attempts > 0 or pool != chosen:
                    reason = last.code().name.lower() if last is not None else "unavailable"
                    self.metrics.fallbacks.labels(prev_pool or "none", pool, reason).inc()
                attempts += 1
                tried.add(ep)
                req.pool = pool
                req.mode = ep.mode
                call = ep.stub.Generate(req, timeout=remaining, metadata=metadata)
                trial = ep.acquire(kind)
                t = time.perf_counter()
                try:
                    first = await call.read()
                except grpc.aio.AioRpcError as exc:
                    ep.release(trial, kind)
                    record_rpc_failure(ep, exc)
                    if exc.code() not in RETRYABLE:
                        raise WorkerRejected(exc.code(), exc.details()) from exc
                    last, prev_pool = exc, pool
                    continue
                except BaseException:
                    ep.release(trial, kind)
                    call.cancel()
                    raise
                up = Upstream(ep, pool, call, None if first is grpc.aio.EOF else first, attempts, trial=trial,
                              kind=kind)
                up.worker_s = time.perf_counter() - t
                return up
        if last is not None:
            raise NoWorker(last.code(), last.details())
        raise NoWorker()
