"""Worker pools: gRPC clients (grpc.aio), health checks, `Load` polling, least-loaded choice and a
circuit breaker per endpoint.

An endpoint can take requests when its last health check passed and its breaker is closed. An open
breaker refuses everything until its cooldown has run out; it is then half-open: exactly one trial
request may go through (`acquire` marks it), and its outcome closes the breaker (success) or opens it
again for another cooldown (failure). A connection-level failure on a request marks the endpoint
unhealthy immediately, so the following requests go elsewhere without waiting for the next health
check.

A worker serving several engine modes over one target (`specroute worker --engine mtp,dfly,ar`) can
be a member of several pools, one per mode (`--pool-mode NAME=MODE`): each pool's endpoint asks for
its mode (`GenerateRequest.mode`) and is unavailable while the worker does not offer it.

A worker's `Info` (model id, engine, limits) is fetched when the endpoint is first seen, again each
time it comes back after a failed health check (a restarted worker may serve another model or
engine), and every `info_interval_s` in any case.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.affinity import Candidate, choose
from router.discovery import DnsDiscovery, Resolver
from router.estimate import NON_SPECULATIVE_ENGINES
from router.policy import PoolState
from router.tasks import run_every, stop_tasks
from specroute.v1 import engine_pb2, engine_pb2_grpc

log = logging.getLogger("specroute.gateway.pools")

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class WorkerLoad:
    """Requests this gateway has in flight to one worker address, from every pool: pools may share
    workers (one multi-mode worker serving the `mtp` and `dfly` pools), and balancing each pool on its
    own requests alone would stack one pool's rows on the worker that is busy with another's."""

    __slots__ = ("inflight", "kinds")

    def __init__(self) -> None:
        self.inflight = 0
        self.kinds: Counter[str] = Counter()   # in flight by request kind (router/affinity.py)


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
        self.info: engine_pb2.InfoResponse | None = None
        self.load: engine_pb2.LoadResponse | None = None
        self.inflight = 0
        self.failures = 0
        self.open_until = 0.0
        self.breaker_failures = breaker_failures
        self.breaker_cooldown_s = breaker_cooldown_s
        self.trial = False  # the half-open breaker's one trial request is in flight
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

    # -- circuit breaker -------------------------------------------------------------------
    def available(self, now: float) -> bool:
        """Whether a new request may go here: healthy, and the breaker closed, or half-open with its
        trial request not yet taken."""
        if not self.healthy:
            return False
        if self.failures < self.breaker_failures:
            return True
        return now >= self.open_until and not self.trial

    @property
    def breaker_state(self) -> str:
        if self.failures < self.breaker_failures:
            return "closed"
        return "open" if time.monotonic() < self.open_until else "half_open"

    def acquire(self, kind: str = "") -> bool:
        """A request (of affinity `kind`) starts here; returns whether it is the half-open breaker's trial
        request (which keeps every other request away until `release`, `record_success` or
        `record_failure`)."""
        self.inflight += 1
        self.worker.inflight += 1
        self.worker.kinds[kind] += 1
        if self.failures >= self.breaker_failures:
            self.trial = True
            return True
        return False

    def release(self, trial: bool, kind: str = "") -> None:
        """The request started by `acquire` is over (its outcome recorded, or none: e.g. cancelled)."""
        self.inflight -= 1
        self.worker.inflight -= 1
        self.worker.kinds[kind] -= 1
        if trial:
            self.trial = False

    def record_success(self) -> None:
        self.failures = 0
        self.open_until = 0.0
        self.trial = False

    def record_failure(self, error: str, *, connection: bool = False) -> None:
        self.failures += 1
        self.last_error = error
        if connection:
            self.healthy = False
        if self.failures >= self.breaker_failures:
            self.open_until = time.monotonic() + self.breaker_cooldown_s
            self.trial = False

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
            self.healthy = True
        except (grpc.aio.AioRpcError, RuntimeError) as exc:
            if self.healthy:
                log.warning("endpoint %s/%s failed its health check: %s", self.pool, self.address, exc)
            self.healthy = False
            self.last_error = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        self.last_check = time.time()

    def describe(self) -> dict[str, object]:
        info = self.info
        load = self.load
        return {
            "address": self.address,
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


def speculation(eps: Iterable[Endpoint], now: float) -> tuple[bool, float | None, float | None]:
    """Whether a pool speculates (False only when every available endpoint runs an engine kind that
    never drafts, e.g. `ar`), the drafts per step its D-Cut keeps now (kept ratio x block size,
    averaged over the endpoints with D-Cut on; None when none has it on), and the tokens per forward
    where its steps turn compute-bound (mean over the endpoints that measured it; None if none did)."""
    seen = spec = False
    kept: list[float] = []
    bound: list[float] = []
    for e in eps:
        if not e.available(now):
            continue
        seen = True
        info, load = e.info, e.load
        spec = spec or info is None or e.engine not in NON_SPECULATIVE_ENGINES
        if info is not None and info.compute_bound_tokens > 0:
            bound.append(info.compute_bound_tokens)
        if load is not None and load.dcut_enabled and e.block_size > 0:
            kept.append(load.kept_ratio * e.block_size)
    return (spec or not seen, (sum(kept) / len(kept) if kept else None),
            (sum(bound) / len(bound) if bound else None))


class PoolManager:
    def __init__(
        self,
        pools: Mapping[str, Iterable[str]],
        *,
        health_interval_s: float = 1.0,
        health_timeout_s: float = 1.0,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 5.0,
        info_interval_s: float = 10.0,
        rng: random.Random | None = None,
        resolver: Resolver | None = None,
        dns_refresh_s: float = 5.0,
        modes: Mapping[str, str] | None = None,
        affinity_slack: float = 0.0,
    ) -> None:
        modes = dict(modes or {})   # pool -> engine mode its endpoints ask for

        # `dns:///HOST:PORT` members: one endpoint per resolved address, kept current (router/discovery.py)
        workers: dict[str, WorkerLoad] = {}   # address -> what every pool has in flight there

        def endpoint(pool: str, address: str) -> Endpoint:
            return Endpoint(pool, address, breaker_failures, breaker_cooldown_s, info_interval_s, modes.get(pool, ""),
                            workers.setdefault(address, WorkerLoad()))

        static, self.discovery = DnsDiscovery.split(pools, endpoint, resolver, dns_refresh_s)
        self.pools: dict[str, list[Endpoint]] = {
            name: [endpoint(name, a) for a in addrs] for name, addrs in static.items()
        }
        self.affinity_slack = affinity_slack   # rows of balance a request's batch affinity may cost
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def names(self) -> list[str]:
        return list(self.pools)

    def endpoints(self) -> list[Endpoint]:
        return [e for eps in self.pools.values() for e in eps]

    async def check_all(self) -> None:
        await asyncio.gather(*(e.check(self.health_timeout_s) for e in self.endpoints()))

    async def start(self) -> None:
        await self.discovery.start(self)
        for e in self.endpoints():
            e.connect()
        await self.check_all()
        self._task = asyncio.create_task(
            run_every(self.health_interval_s, self.check_all, lambda: self._closing, "health loop"),
            name="specroute-pool-health")

    async def close(self) -> None:
        """Stop the health/Load poller (and wait for it), then close every channel."""
        self._closing = True
        await self.discovery.close()
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None
        await asyncio.gather(*(e.close() for e in self.endpoints()), return_exceptions=True)

    def states(self) -> dict[str, PoolState]:
        """Health and load per pool over its available endpoints (called on every request: one pass)."""
        now = time.monotonic()
        out: dict[str, PoolState] = {}
        for name, eps in self.pools.items():
            n = running = waiting = max_running = 0
            for e in eps:
                if e.available(now):
                    n += 1
                    load = e.load
                    if load is not None:
                        running += load.running
                        waiting += load.waiting
                        max_running += load.max_running
            spec, draft_now, bound = speculation(eps, now)
            out[name] = PoolState(healthy=n > 0, running=running, waiting=waiting, max_running=max_running,
                                  endpoints=n, speculative=spec, draft_now=draft_now, compute_bound_tokens=bound)
        return out

    def pick(self, pool: str, exclude: set[Endpoint] | None = None, kind: str = "") -> Endpoint | None:
        """The available endpoint of `pool` for a request of affinity `kind`: the least loaded, or within
        `affinity_slack` rows of it the one whose worker runs fewest rows of another kind
        (router/affinity.py); random among ties."""
        now = time.monotonic()
        eps = [e for e in self.pools.get(pool, ()) if not (exclude and e in exclude) and e.available(now)]
        cands = [Candidate(e.score(), 1.0 / e.capacity(), e.worker.kinds[kind], e.worker.inflight) for e in eps]
        best = [eps[i] for i in choose(cands, self.affinity_slack if kind else 0.0)]
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rng.choice(best)

    def model_ids(self) -> list[str]:
        ids = {e.info.model_id for e in self.endpoints() if e.info is not None and e.info.model_id}
        return sorted(ids)

    def pools_of_models(self) -> dict[str, list[dict[str, str]]]:
        """Model id -> the pools serving it, with their engine and speculation (our engines or vLLM)."""
        out: dict[str, list[dict[str, str]]] = {}
        for name, eps in self.pools.items():
            seen: set[str] = set()
            for e in eps:
                i = e.info
                if i is not None and i.model_id and i.model_id not in seen:
                    seen.add(i.model_id)
                    drafter = next((m.drafter for m in i.modes if m.engine == e.mode), i.drafter) if e.mode else i.drafter
                    out.setdefault(i.model_id, []).append({"pool": name, "engine": e.engine, "drafter": drafter})
        return out

    def max_context(self, pool: str) -> int:
        vals = [e.info.max_context for e in self.pools.get(pool, ()) if e.info is not None and e.info.max_context]
        return min(vals) if vals else 0

    def largest_context(self) -> int:
        """The largest context any known worker has (0 = none known yet): a prompt that does not fit
        it fits no pool."""
        return max((e.info.max_context for e in self.endpoints() if e.info is not None), default=0)
