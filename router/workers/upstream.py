"""Opening a worker call: pick an endpoint, start `Generate` and wait for its first chunk (or call the
unary `Complete` and wait for the whole answer), and before that retry elsewhere (another endpoint of
the pool, then the next pool of the policy's `fallback_order`). A worker without `Complete`
(UNIMPLEMENTED) is asked with `Generate` instead, at once and from then on.

Failures are domain errors (`UpstreamError` and its subclasses); the API layer (router/http/errors.py)
turns them into OpenAI error responses.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

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
    """An open worker call whose first chunk has arrived (so it is past the retry window); a unary
    call's one chunk is the whole answer (`call` None)."""

    endpoint: Endpoint
    pool: str
    call: Any
    first: Any  # engine_pb2.GenerateChunk, or None when the worker sent nothing
    attempts: int
    worker_s: float = 0.0  # time spent waiting on the worker
    ttft_s: float = 0.0  # time to first token (the worker's, for a unary call)
    trial: bool = False  # the endpoint's half-open breaker trial (router/workers/breaker.py)
    batch: str = ""  # the request's batch kind (router/routing/affinity.py), counted on its worker
    # migration (router/workers/migrate.py): called when the stream fails after its first chunk; True
    # when it moved the stream to another worker (`adopt`), whose chunks then follow
    resume: Callable[[Upstream, grpc.aio.AioRpcError], Awaitable[bool]] | None = None
    ids: list[int] | None = None  # the token ids received so far (kept while `resume` is set)
    chars: int = 0  # and the characters of their text
    counted: int = 0  # the tokens the chunks said they carried
    offset: int = 0  # tokens a continuation counts as prompt that are the request's completion
    migrations: int = 0
    _closed: bool = False

    async def chunks(self, on_wait: Callable[[float], None] | None = None) -> AsyncIterator[Any]:
        """The stream's chunks, from the first to the final one (the one with `finish_reason`, after
        which the call's status is awaited); `on_wait` gets each wait for a further chunk, s."""
        chunk = self.first
        while chunk is not None:
            if self.resume is not None:
                self._seen(chunk)
            yield chunk
            if chunk.finish_reason:
                await self.finish()
                return
            t = time.perf_counter()
            try:
                nxt = await self.call.read()
            except grpc.aio.AioRpcError as exc:
                if self.resume is None or not await self.resume(self, exc):
                    raise
                nxt = self.first  # the continuation's first chunk
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
        if self.call is None:
            return
        t = time.perf_counter()
        try:
            if await self.call.code() != grpc.StatusCode.OK:
                await self.call.read()  # the call is over: this raises its error
        finally:
            self.worker_s += time.perf_counter() - t

    def _seen(self, chunk: Any) -> None:
        if self.offset:  # a continuation's counts: its prefix is the request's completion, not prompt
            if chunk.prompt_tokens:
                chunk.prompt_tokens -= self.offset
            if chunk.completion_tokens:
                chunk.completion_tokens += self.offset
        if self.ids is None:
            self.ids = []
        self.ids.extend(chunk.token_ids)
        self.chars += len(chunk.text)
        self.counted += chunk.num_tokens

    def adopt(self, new: Upstream) -> None:
        """Continue on `new`, the continuation of this stream on another worker: the failed call's
        endpoint is released, and the counts of `new` are shifted by the tokens already received."""
        self.endpoint.release(self.trial, self.batch)
        if self.call is not None and not self.call.done():
            self.call.cancel()
        self.endpoint, self.pool, self.call, self.first, self.trial = new.endpoint, new.pool, new.call, new.first, new.trial
        self.attempts += new.attempts
        self.offset = len(self.ids or ())
        self.migrations += 1

    def failed(self, exc: grpc.aio.AioRpcError) -> None:
        record_rpc_failure(self.endpoint, exc)

    def close(self, ok: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.endpoint.release(self.trial, self.batch)
        if ok:
            self.endpoint.record_success()
        elif self.call is not None and not self.call.done():
            self.call.cancel()


class Dispatcher:
    def __init__(self, pools: PoolManager, metrics: Metrics, max_attempts: int) -> None:
        self.pools = pools
        self.metrics = metrics
        self.max_attempts = max_attempts

    async def open(self, order: Sequence[str], req: engine_pb2.GenerateRequest, deadline: float, *,
                   batch: str = "", metadata: tuple[tuple[str, str], ...] | None = None,
                   unary: bool = False, exclude: Collection[Endpoint] = (), prefer: str | None = None) -> Upstream:
        """Start the worker call and wait for its first chunk (`unary`: its whole answer), trying the
        pools of `order` (the decision's pool first) and at most `max_attempts` endpoints in all
        (`batch`: the request's batch kind; `metadata`: gRPC metadata of every try, e.g. the trace
        context; `exclude`: endpoints not to try; `prefer`: the address of the first pool's endpoint to try
        first while it is available, a conversation's worker)."""
        tried: set[Endpoint] = set(exclude)
        attempts = 0
        last: grpc.aio.AioRpcError | None = None
        chosen = prev_pool = order[0] if order else None
        for pool in order:
            while attempts < self.max_attempts:
                ep = self.pools.pick(pool, tried, batch, prefer if pool == chosen else None)
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
                trial = ep.acquire(batch)
                t = time.perf_counter()
                try:
                    up = await _first(ep, req, remaining, metadata, unary and ep.unary)
                except grpc.aio.AioRpcError as exc:
                    ep.release(trial, batch)
                    record_rpc_failure(ep, exc)
                    if exc.code() not in RETRYABLE:
                        raise WorkerRejected(exc.code(), exc.details()) from exc
                    last, prev_pool = exc, pool
                    continue
                except BaseException:
                    ep.release(trial, batch)
                    raise
                up.pool, up.attempts, up.trial, up.batch = pool, attempts, trial, batch
                up.worker_s = time.perf_counter() - t
                up.ttft_s = up.first.ttft_ms / 1000.0 if up.call is None and up.first is not None else up.worker_s
                return up
        if last is not None:
            raise NoWorker(last.code(), last.details())
        raise NoWorker()


async def _first(ep: Endpoint, req: engine_pb2.GenerateRequest, timeout: float,
                 metadata: tuple[tuple[str, str], ...] | None, unary: bool) -> Upstream:
    """One try on `ep`: the unary answer, or the stream with its first chunk read."""
    if unary:
        try:
            return Upstream(ep, "", None, await ep.stub.Complete(req, timeout=timeout, metadata=metadata), 0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            ep.unary = False   # a worker from before `Complete`: stream from now on
    call = ep.stub.Generate(req, timeout=timeout, metadata=metadata)
    try:
        first = await call.read()
    except BaseException:
        call.cancel()
        raise
    return Upstream(ep, "", call, None if first is grpc.aio.EOF else first, 0)
