"""One worker endpoint of a pool: its gRPC channel and stubs, health checks, `Info` and `Load`, the
load score balancing reads, and its circuit breaker (router/workers/breaker.py).

A connection-level failure on a request marks the endpoint unhealthy at once, so the following
requests go elsewhere without waiting for the next health check. A worker's `Info` is fetched when the
endpoint is first seen, again each time it comes back after a failed health check (a restarted worker
may serve another model or engine), and every `info_interval_s` in any case. A worker serving several
engine modes can be a member of several pools, one per mode: the endpoint asks for its pool's mode
(`GenerateRequest.mode`) and is unavailable while the worker does not offer it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.routing.conversation import worker_id
from router.workers.breaker import Breaker
from specroute.v1 import engine_pb2, engine_pb2_grpc

log = logging.getLogger("specroute.gateway.pools")

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.enable_retries", 0),  # the dispatcher retries itself; core retries cost every call CPU
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class WorkerLoad:
    """Requests this gateway has in flight to one worker address, from every pool: pools may share
    workers (one multi-mode worker serving the `mtp` and `dfly` pools), and balancing each pool on its
    own requests alone would stack one pool's rows on the worker that is busy with another's."""

    __slots__ = ("inflight", "batches")

    def __init__(self) -> None:
        self.inflight = 0
        self.batches: Counter[str] = Counter()   # in flight by batch kind (router/routing/affinity.py)


class Endpoint:
    def __init__(self, pool: str, address: str, breaker_failures: int, breaker_cooldown_s: float,
                 info_interval_s: float = 10.0, mode: str = "", worker: WorkerLoad | None = None) -> None:
        self.pool = pool
        self.address = address
        self.mode = mode    # engine mode asked of the worker ("": its default)
        self.worker = worker if worker is not None else WorkerLoad()   # shared by the pools on this address
        # channels bind to the running event loop: created in `connect()` (from PoolManager.start)
        self.channel: grpc.aio.Channel | None = None
        self.stub: engine_pb2_grpc.EngineStub = None  # type: ignore[assignment]
        self.health_stub: health_pb2_grpc.HealthStub = None  # type: ignore[assignment]
        self.healthy = False
        self.check_failed = False   # the last health check failed (an outage, not only failed requests)
        self.info: engine_pb2.InfoResponse | None = None
        self.load: engine_pb2.LoadResponse | None = None
        self.inflight = 0
        self.breaker = Breaker(breaker_failures, breaker_cooldown_s)
        self.unary = True   # the worker answers `Complete` (False once it said UNIMPLEMENTED)
        self.info_interval_s = info_interval_s
        self.info_at = 0.0  # monotonic time of the last `Info`
        self.last_error = ""
        self.last_check = 0.0

    def connect(self) -> None:
        if self.channel is None:
            self.channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self.stub = engine_pb2_grpc.EngineStub(self.channel)
            self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    @property
    def engine(self) -> str:
        """The engine kind this endpoint's requests run with: its mode, else the worker's engine."""
        return self.mode or (self.info.engine if self.info is not None else "")

    @property
    def block_size(self) -> int:
        """Draft tokens per step in this endpoint's mode (from `Info`; 0 when unknown)."""
        info = self.info
        if info is None:
            return 0
        if self.mode:
            return next((m.block_size for m in info.modes if m.engine == self.mode), 0)
        return info.block_size

    def offers_mode(self, info: engine_pb2.InfoResponse) -> bool:
        """Whether the worker serves this endpoint's mode (any worker serves the default)."""
        return not self.mode or self.mode in ([m.engine for m in info.modes] or [info.engine])

    # -- circuit breaker (router/workers/breaker.py) ---------------------------------------
    def available(self, now: float) -> bool:
        """Whether a new request may go here: healthy, and the breaker lets it through."""
        return self.healthy and self.breaker.allows(now)

    @property
    def breaker_state(self) -> str:
        return self.breaker.state(time.monotonic())

    @property
    def failures(self) -> int:
        return self.breaker.failures

    def acquire(self, batch: str = "") -> bool:
        """A request (of batch kind `batch`) starts here; returns whether it is the half-open breaker's trial."""
        self.inflight += 1
        self.worker.inflight += 1
        self.worker.batches[batch] += 1
        return self.breaker.acquire()

    def release(self, trial: bool, batch: str = "") -> None:
        """The request started by `acquire` is over (its outcome recorded, or none: e.g. cancelled)."""
        self.inflight -= 1
        self.worker.inflight -= 1
        self.worker.batches[batch] -= 1
        self.breaker.release(trial)

    def record_success(self) -> None:
        self.breaker.success()

    def record_failure(self, error: str, *, connection: bool = False) -> None:
        self.last_error = error
        if connection:
            self.healthy = False
        self.breaker.failure(time.monotonic())

    # -- load --------------------------------------------------------------------------------
    def capacity(self) -> int:
        cap = (self.load.max_running if self.load is not None else 0) or (
            self.info.max_running if self.info is not None else 0
        )
        return max(cap, 1)

    def score(self) -> float:
        remote = (self.load.running + self.load.waiting) if self.load is not None else 0
        return max(self.worker.inflight, remote) / self.capacity()

    async def check(self, timeout: float) -> None:
        """One health check: grpc.health.v1 Check, then Info (when not known, when the endpoint comes
        back after a failure, or when `info_interval_s` has passed), then Load."""
        try:
            resp = await self.health_stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
            if resp.status != health_pb2.HealthCheckResponse.SERVING:
                raise RuntimeError(f"health status {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}")
            now = time.monotonic()
            info = self.info
            if info is None or not self.healthy or now - self.info_at >= self.info_interval_s:
                info = await self.stub.Info(engine_pb2.InfoRequest(), timeout=timeout)
            if not self.offers_mode(info):
                raise RuntimeError(f"the worker does not serve mode {self.mode!r} "
                                   f"(it serves {', '.join(m.engine for m in info.modes) or info.engine})")
            load = await self.stub.Load(engine_pb2.LoadRequest(), timeout=timeout)
            # what the check learned is published at once, with no await in between: a restarted worker's
            # new model is never listed (/v1/models) while its endpoint still reads unhealthy
            if info is not self.info:
                if self.info is not None and (info.model_id, info.engine) != (self.info.model_id, self.info.engine):
                    log.info("endpoint %s/%s now serves %s (%s), was %s (%s)", self.pool, self.address,
                             info.model_id, info.engine, self.info.model_id, self.info.engine)
                self.info, self.info_at = info, now
            self.load = load
            if not self.healthy:
                log.info("endpoint %s/%s is healthy", self.pool, self.address)
            if self.check_failed:
                # back from an outage its own health checks saw (a restarted worker): the breaker counted
                # the outage, which this check ends, so it starts closed rather than letting one half-open
                # trial through at a time while it may be the only endpoint left. A worker whose requests
                # fail while its checks pass keeps its breaker.
                self.breaker.success()
                self.check_failed = False
            self.healthy = True
        except (grpc.aio.AioRpcError, RuntimeError) as exc:
            if self.healthy:
                log.warning("endpoint %s/%s failed its health check: %s", self.pool, self.address, exc)
            self.healthy = False
            self.check_failed = True
            self.last_error = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        self.last_check = time.time()

    def describe(self) -> dict[str, object]:
        info = self.info
        load = self.load
        return {
            "address": self.address,
            "worker_id": worker_id(self.address),
            "mode": self.mode,
            "healthy": self.healthy,
            "breaker": self.breaker_state,
            "consecutive_failures": self.failures,
            "inflight": self.inflight,
            "last_error": self.last_error,
            "last_check": self.last_check,
            "info": None if info is None else {
                "model_id": info.model_id, "engine": info.engine, "drafter": info.drafter,
                "block_size": info.block_size, "max_context": info.max_context, "max_running": info.max_running,
                "dcut": info.dcut, "version": info.version,
                "modes": [m.engine for m in info.modes],
            },
            "load": None if load is None else {
                "running": load.running, "waiting": load.waiting, "cache_usage": load.cache_usage,
                "tokens_per_s": load.tokens_per_s, "mean_accepted_length": load.mean_accepted_length,
                "max_running": load.max_running,
            },
        }
