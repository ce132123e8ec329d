"""Moving a stream whose worker failed after its first chunk to another worker, from the prompt plus
the tokens already received (`GenerateRequest.prefix_token_ids`, `prefix_chars`): the new worker
generates after them as the failed one would have (at T=0 the same tokens; at T>0 a sample of the
target given that prefix), and the client sees one uninterrupted stream.

A migration is tried only for a failure that another worker may not share (`RETRYABLE`), at most
`MAX_MIGRATIONS` times per request, within the request's deadline, on another endpoint of the pool or
the next pool of the policy's fallback order (never an endpoint that failed this request), and only
when every received token came with its id. Each one is counted
(`specroute_migrations_total{from_pool,to_pool}`) and logged with the request id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from router.observability.metrics import Metrics
from router.workers.endpoint import Endpoint
from router.workers.upstream import RETRYABLE, Dispatcher, Upstream, UpstreamError, record_rpc_failure
from specroute.v1 import engine_pb2

log = logging.getLogger("specroute.gateway.migrate")

MAX_MIGRATIONS = 2


class Migration:
    """The `Upstream.resume` of one request's stream."""

    def __init__(self, dispatcher: Dispatcher, metrics: Metrics, order: Sequence[str],
                 req: engine_pb2.GenerateRequest, deadline: float, batch: str,
                 metadata: tuple[tuple[str, str], ...] | None) -> None:
        self.dispatcher, self.metrics = dispatcher, metrics
        self.order, self.req, self.deadline = list(order), req, deadline
        self.batch, self.metadata = batch, metadata
        self.failed: set[Endpoint] = set()

    async def __call__(self, up: Upstream, exc: grpc.aio.AioRpcError) -> bool:
        ids = up.ids or []
        received = len(ids)
        if (exc.code() not in RETRYABLE or up.migrations >= MAX_MIGRATIONS or time.monotonic() >= self.deadline
                or received == 0 or received != up.counted):
            return False
        record_rpc_failure(up.endpoint, exc)
        self.failed.add(up.endpoint)
        req = engine_pb2.GenerateRequest()
        req.CopyFrom(self.req)
        req.prefix_token_ids[:] = ids
        req.prefix_chars = up.chars
        order = [up.pool, *(p for p in self.order if p != up.pool)]
        try:
            new = await self.dispatcher.open(order, req, self.deadline, batch=self.batch, metadata=self.metadata,
                                             exclude=self.failed)
        except UpstreamError as err:
            log.warning("request %s: worker %s failed mid-stream (%s) and no other worker continued it: %s",
                        req.request_id, up.endpoint.address, exc.code().name, err)
            return False
        log.warning("request %s: worker %s failed mid-stream (%s); continued on %s (pool %s) after %d tokens",
                    req.request_id, up.endpoint.address, exc.code().name, new.endpoint.address, new.pool, received)
        self.metrics.migrations.labels(up.pool, new.pool).inc()
        up.adopt(new)
        return True
