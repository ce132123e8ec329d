"""The gateway's runtime object: owns pools, store, metrics, classifier and the policy/stats snapshot.

Created by the app factory and kept on `app.state.gateway`; there is no module-level state. The
request path reads `self.snapshot` (an immutable object swapped by background tasks) and never
awaits Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from redis.exceptions import RedisError

from router.errors import ENDPOINT_FAILURES, RETRYABLE, APIError, from_grpc
from router.feedback import CellStats, FeedbackRecord, make_recorder
from router.metrics import Metrics
from router.policy import UNKNOWN_DOMAIN, Decision, Policy, decide, default_policy
from router.pools import Endpoint, PoolManager
from router.settings import Settings
from router.store import EVENTS_CHANNEL, PolicyStore, VersionConflict, parse_policy
from router.tasks import stop_tasks
from specroute.v1 import engine_pb2

log = logging.getLogger("specroute.gateway")

ClassifyFn = Callable[[list[dict[str, str]]], tuple[str, Mapping[str, float], float]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    policy: Policy
    stats: Mapping[tuple[str, str], CellStats] = field(default_factory=dict)
    fetched_at: float = 0.0  # local wall clock of the last successful pull (0 = never)


@dataclass(slots=True)
class Upstream:
    """An open worker stream whose first chunk has arrived (so it is past the retry window)."""

    endpoint: Endpoint
    pool: str
    call: Any
    first: Any  # engine_pb2.GenerateChunk, or None when the worker sent nothing
    attempts: int
    worker_s: float = 0.0  # time spent waiting on the worker
    _closed: bool = False

    async def read(self) -> Any:
        t = time.perf_counter()
        try:
            return await self.call.read()
        finally:
            self.worker_s += time.perf_counter() - t

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

    def close(self, ok: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.endpoint.inflight -= 1
        if ok:
            self.endpoint.record_success()
        elif not self.call.done():
            self.call.cancel()


PROBE = [{"role": "user", "content": "Write a Python function that returns the sum of a list."}]


def _load_classifier() -> ClassifyFn:
    """Import `classifier.classify` lazily and probe it once (loads the artifact, surfaces errors now)."""
    from classifier import classify  # the gateway may start before the artifact is trained

    classify(PROBE)
    return classify  # type: ignore[no-any-return]


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        classify: ClassifyFn | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.rng = rng or random.Random(settings.seed)
        self.pools = PoolManager(
            settings.pools,
            health_interval_s=settings.health_interval_s,
            health_timeout_s=settings.health_timeout_s,
            breaker_failures=settings.breaker_failures,
            breaker_cooldown_s=settings.breaker_cooldown_s,
            rng=self.rng,
        )
        self.store = PolicyStore(settings.redis_url, settings.redis_timeout_s) if settings.redis_url else None
        self.snapshot = Snapshot(default_policy(self.pools.names))
        self.classify_fn: ClassifyFn | None = classify
        self.classifier_error: str | None = None
        self.decisions: Counter[tuple[str, str, str]] = Counter()
        self.redis_ok = False
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False  # set by close(): every background loop exits at its next check
        self._feedback: asyncio.Queue[FeedbackRecord] | None = None
        self.started_at = time.time()
        self._classify_warned = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self.classify_fn is None:
            await self._load_classifier()
        await self.pools.start()
        if self.store is not None:
            try:
                self._apply_policy(await self.store.init(self.snapshot.policy), force=True)
                await self.refresh()
            except (RedisError, OSError) as exc:
                self._redis_error(exc)
            self._tasks.append(asyncio.create_task(self._refresh_loop(), name="specroute-refresh"))
            self._tasks.append(asyncio.create_task(self._listen_loop(), name="specroute-policy-events"))
            if self.settings.gateway_feedback:
                self._feedback = asyncio.Queue(maxsize=10_000)
                self._tasks.append(asyncio.create_task(self._feedback_loop(), name="specroute-feedback"))
        self.metrics.policy_version.set(self.snapshot.policy.version)

    async def _load_classifier(self) -> None:
        try:
            self.classify_fn = await asyncio.to_thread(_load_classifier)
            self.classifier_error = None
        except Exception as exc:  # classifier missing or broken: not ready, route to the safe pool
            err = f"{type(exc).__name__}: {str(exc)[:300]}"
            if err != self.classifier_error:
                log.error("classifier unavailable (requests go to the safe pool): %s", err)
            self.classifier_error = err
            if not any(t.get_name() == "specroute-classifier-retry" for t in self._tasks):
                self._tasks.append(asyncio.create_task(self._classifier_retry(), name="specroute-classifier-retry"))

    async def _classifier_retry(self) -> None:
        while self.classify_fn is None and not self._closing:
            await asyncio.sleep(30.0)
            with contextlib.suppress(Exception):
                self.classify_fn = await asyncio.to_thread(_load_classifier)
                self.classifier_error = None
                log.info("classifier loaded")

    async def close(self) -> None:
        """Stop every background task (refresh, policy listener, feedback, classifier retry) and wait
        for it, then close the pools (health/Load poller, channels) and the Redis client."""
        self._closing = True
        try:
            await stop_tasks(self._tasks)
            self._tasks.clear()
        finally:
            await self.pools.close()
            if self.store is not None:
                await self.store.close()

    # -- snapshot maintenance (background only) --------------------------------------------
    def _redis_error(self, exc: BaseException) -> None:
        self.metrics.redis_errors.inc()
        if self.redis_ok:
            log.warning("redis unavailable, serving on the last snapshot: %s", exc)
        self.redis_ok = False

    def _apply_policy(self, policy: Policy | None, *, force: bool = False) -> None:
        cur = self.snapshot.policy
        if policy is None or policy == cur or (not force and policy.version <= cur.version):
            return
        log.info("policy version %d applied", policy.version)
        self.snapshot = Snapshot(policy, self.snapshot.stats, self.snapshot.fetched_at)
        self.metrics.policy_version.set(policy.version)

    def cells(self) -> list[tuple[str, str]]:
        pol = self.snapshot.policy
        pools = list(dict.fromkeys([*pol.pools, *self.pools.names]))
        return [(d, p) for d in pol.domains for p in pools]

    async def refresh(self) -> None:
        """Pull policy and statistics once (about every second from the refresh loop)."""
        assert self.store is not None
        policy, stats, now = await self.store.pull(self.cells())
        if policy is None:  # Redis lost its data (restart without persistence): re-seed it
            policy = await self.store.init(self.snapshot.policy)
        self._apply_policy(policy, force=True)
        hl = self.snapshot.policy.half_life_s
        aged = {cell: s.decayed_to(now, hl) for cell, s in stats.items()}
        self.snapshot = Snapshot(self.snapshot.policy, aged, time.time())
        for (d, p), s in aged.items():
            mal = s.mean_accepted_length
            if mal is not None:
                self.metrics.pool_mean_accepted_length.labels(d, p).set(mal)
        if not self.redis_ok:
            log.info("redis reachable")
        self.redis_ok = True

    async def _refresh_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.settings.stats_interval_s)
            if self._closing:
                return
            try:
                await self.refresh()
            except (TimeoutError, RedisError, OSError) as exc:
                self._redis_error(exc)
            except Exception:  # pragma: no cover
                log.exception("refresh loop")
            for name, st in self.pools.states().items():
                self.metrics.pool_healthy_endpoints.labels(name).set(st.endpoints)
            if self.snapshot.fetched_at:
                self.metrics.snapshot_age_seconds.set(time.time() - self.snapshot.fetched_at)

    async def _listen_loop(self) -> None:
        assert self.store is not None
        while not self._closing:
            client = self.store.pubsub_client()
            ps = client.pubsub(ignore_subscribe_messages=True)
            try:
                await ps.subscribe(EVENTS_CHANNEL)
                # close the gap between subscribing and the last pull: anything written before now
                self._apply_policy(await self.store.get())
                while not self._closing:
                    msg = await ps.get_message(timeout=5.0)
                    if msg and msg.get("type") == "message":
                        try:
                            self._apply_policy(parse_policy(msg["data"]))
                        except ValueError as exc:
                            log.error("ignoring invalid policy event: %s", exc)
            except (TimeoutError, RedisError, OSError) as exc:
                if self._closing:
                    return
                self._redis_error(exc)
                await asyncio.sleep(min(1.0, self.settings.stats_interval_s))
            finally:
                with contextlib.suppress(Exception):
                    await ps.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _feedback_loop(self) -> None:
        assert self.store is not None and self._feedback is not None
        record = make_recorder(self.store.client)
        while not self._closing:
            rec = await self._feedback.get()
            try:
                await record(rec)
            except (TimeoutError, RedisError, OSError) as exc:
                self._redis_error(exc)

    def feedback(self, rec: FeedbackRecord) -> None:
        if self._feedback is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._feedback.put_nowait(rec)

    # -- admin writes ------------------------------------------------------------------------
    async def put_policy(self, new: Policy, expected_version: int, actor: str, action: str = "put",
                         note: str = "") -> Policy:
        if self.store is None:
            raise APIError(503, "no policy store configured (set SPECROUTE_REDIS_URL)", code="store_unavailable")
        try:
            current = await self.store.get()
            written = await self.store.put(new, expected_version, actor, action, note, old=current)
        except VersionConflict as exc:
            raise APIError(412, f"policy changed meanwhile: current version is {exc.current}, "
                                f"If-Match was {expected_version}", code="version_conflict") from exc
        except (RedisError, OSError) as exc:
            self._redis_error(exc)
            raise APIError(503, f"policy store unavailable: {exc}", code="store_unavailable") from exc
        self._apply_policy(written, force=True)
        return written

    # -- request path --------------------------------------------------------------------------
    @property
    def ready(self) -> tuple[bool, str]:
        if self.classify_fn is None:
            return False, f"classifier not loaded ({self.classifier_error})"
        if not any(s.healthy for s in self.pools.states().values()):
            return False, "no healthy pool"
        return True, "ok"

    def classify(self, messages: list[dict[str, str]]) -> tuple[str, Mapping[str, float], float]:
        fn = self.classify_fn
        if fn is None:
            return UNKNOWN_DOMAIN, {}, 1.0
        t = time.perf_counter()
        try:
            label, probs, unc = fn(messages)
        except Exception as exc:  # a classifier bug must not fail the request
            now = time.monotonic()
            if now - self._classify_warned > 60.0:
                self._classify_warned = now
                log.warning("classifier failed (request sent to the safe pool): %s", str(exc)[:300])
            return UNKNOWN_DOMAIN, {}, 1.0
        finally:
            self.metrics.classify_seconds.observe(time.perf_counter() - t)
        return label, probs, float(unc)

    def route(self, probs: Mapping[str, float], uncertainty: float) -> Decision:
        snap = self.snapshot
        d = decide(probs, uncertainty, snap.stats, self.pools.states(), snap.policy, self.rng)
        self.decisions[(d.domain, d.pool or "none", d.reason)] += 1
        self.metrics.route_decisions_by(d.domain, d.pool or "none", d.reason).inc()
        return d

    def fallback_pools(self, first: str | None) -> list[str]:
        pol = self.snapshot.policy
        drained = set(pol.drained)
        order = [first] if first else []
        order += [p for p in [*pol.fallback_order, pol.safe_pool, *pol.pools] if p not in drained]
        return [p for p in dict.fromkeys(order) if p in self.pools.pools]

    async def open(self, decision: Decision, req: engine_pb2.GenerateRequest, deadline: float) -> Upstream:
        """Start the worker call and wait for its first chunk, retrying elsewhere before that."""
        tried: set[Endpoint] = set()
        attempts = 0
        last: grpc.aio.AioRpcError | None = None
        prev_pool = decision.pool
        for pool in self.fallback_pools(decision.pool):
            while attempts < self.settings.max_attempts:
                ep = self.pools.pick(pool, tried)
                if ep is None:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise APIError(504, "request deadline exceeded before a worker answered", code="deadline_exceeded")
                if attempts > 0 or pool != decision.pool:
                    reason = last.code().name.lower() if last is not None else "unavailable"
                    self.metrics.fallbacks.labels(prev_pool or "none", pool, reason).inc()
                attempts += 1
                tried.add(ep)
                req.pool = pool
                call = ep.stub.Generate(req, timeout=remaining)
                ep.inflight += 1
                t = time.perf_counter()
                try:
                    first = await call.read()
                except grpc.aio.AioRpcError as exc:
                    ep.inflight -= 1
                    code = exc.code()
                    if code in ENDPOINT_FAILURES:
                        ep.record_failure(exc.details() or code.name, connection=code == grpc.StatusCode.UNAVAILABLE)
                    if code not in RETRYABLE:
                        raise from_grpc(code, exc.details()) from exc
                    last, prev_pool = exc, pool
                    continue
                except BaseException:
                    ep.inflight -= 1
                    call.cancel()
                    raise
                up = Upstream(ep, pool, call, None if first is grpc.aio.EOF else first, attempts)
                up.worker_s = time.perf_counter() - t
                return up
        if last is not None:
            err = from_grpc(last.code(), last.details())
            if err.status == 503 or err.status >= 500:
                err = APIError(503, f"no worker could serve the request: {last.details()}", code="no_healthy_worker")
            raise err
        raise APIError(503, "no healthy worker for this request", code="no_healthy_pool")

    # -- introspection ---------------------------------------------------------------------------
    def served_models(self) -> list[str]:
        names = [self.settings.model_name] if self.settings.model_name else self.pools.model_ids()
        return list(dict.fromkeys([*names, *self.settings.model_aliases]))

    def model_known(self, name: str) -> bool:
        models = self.served_models()
        real = [m for m in models if m not in self.settings.model_aliases]
        return name in models or not real  # nothing known yet: let routing decide (503 if no worker)

    def stats_view(self) -> dict[str, Any]:
        snap = self.snapshot
        cells = [
            {"domain": d, "pool": p, **s.as_dict()} for (d, p), s in sorted(snap.stats.items())
        ]
        totals: Counter[tuple[str, str]] = Counter()
        for (d, p, _r), n in self.decisions.items():
            totals[(d, p)] += n
        per_domain: dict[str, int] = {}
        for (d, _p), n in totals.items():
            per_domain[d] = per_domain.get(d, 0) + n
        shares = [
            {"domain": d, "pool": p, "requests": n, "share": n / per_domain[d] if per_domain.get(d) else 0.0}
            for (d, p), n in sorted(totals.items())
        ]
        reasons = [{"domain": d, "pool": p, "reason": r, "requests": n} for (d, p, r), n in sorted(self.decisions.items())]
        return {
            "policy_version": snap.policy.version,
            "snapshot_age_s": (time.time() - snap.fetched_at) if snap.fetched_at else None,
            "redis_ok": self.redis_ok,
            "cells": cells,
            "routing": shares,
            "reasons": reasons,
        }

    def pools_view(self) -> dict[str, Any]:
        states = self.pools.states()
        return {
            name: {
                "healthy": states[name].healthy,
                "available_endpoints": states[name].endpoints,
                "drained": name in self.snapshot.policy.drained,
                "endpoints": [e.describe() for e in eps],
            }
            for name, eps in self.pools.pools.items()
        }


def messages_for_classifier(pairs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"role": r, "content": c} for r, c in pairs]
