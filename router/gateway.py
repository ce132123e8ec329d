"""The gateway's runtime object: owns pools, store, metrics, classifier and the policy/stats snapshot,
and starts and stops their background tasks.

Created by the app factory and kept on `app.state.gateway`; there is no module-level state. The
request path reads the snapshot (an immutable object swapped by background tasks, router/state/snapshot.py)
and never awaits Redis. Failures are domain errors (router/state/store.py, router/workers/upstream.py); the API
layer maps them to HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import RedisError

from router.keys.store import KeyManager
from router.observability.access_log import AccessLog
from router.observability.metrics import Metrics
from router.observability.timeseries import SeriesSampler
from router.observability.tracing import make_tracing
from router.observability.views import pools_view, stats_view
from router.readiness import Readiness, assess
from router.routing.classification import Classification, Classifier, ClassifyFn
from router.routing.conversation import Sticky, Verdict, stick, sticky_decision
from router.routing.decide import Decision, decide
from router.routing.estimate import PoolState
from router.routing.fallbacks import policy_fallback
from router.routing.policy import Policy, default_policy, fallback_order
from router.routing.shadow import Comparison, compare, predicted_goodput
from router.settings import Settings
from router.state.conversations import Conversations
from router.state.predictor import PredictorTrainer
from router.state.responses import ResponseStore
from router.state.shadow import ShadowTally
from router.state.snapshot import Snapshot, SnapshotSync
from router.state.store import PolicyStore, StoreNotConfigured, StoreUnavailable
from router.tasks import stop_tasks
from router.workers.migrate import Migration
from router.workers.pools import PoolManager
from router.workers.upstream import Dispatcher, Upstream
from specroute.contracts.context import RequestContext
from specroute.contracts.feedback import FeedbackRecord
from specroute.feedback_writer import FeedbackWriter
from specroute.v1 import engine_pb2

__all__ = ["ClassifyFn", "Gateway", "Snapshot"]

T = TypeVar("T")
log = logging.getLogger("specroute.gateway.shadow")


@dataclass(frozen=True, slots=True)
class Turn:
    """A request that continues a conversation served before: where, and what moving it costs."""

    sticky: Sticky
    history_tokens: float
    expected_tokens: float


@dataclass(frozen=True, slots=True)
class Routed:
    decision: Decision
    verdict: Verdict | None = None      # the conversation rule's, for a turn of a known conversation
    shadow: Comparison | None = None    # the shadow policy's decision beside the live one


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
        self.metrics = metrics or Metrics(key_names=settings.metrics_key_names)
        self.rng = rng or random.Random(settings.seed)
        self.pools = PoolManager(
            settings.pools,
            health_interval_s=settings.health_interval_s,
            health_timeout_s=settings.health_timeout_s,
            breaker_failures=settings.breaker_failures,
            breaker_cooldown_s=settings.breaker_cooldown_s,
            info_interval_s=settings.info_interval_s,
            rng=self.rng,
            dns_refresh_s=settings.dns_refresh_s,
            modes=settings.pool_modes,
            affinity_slack=settings.affinity_slack,
        )
        self.store = PolicyStore(settings.redis_url, settings.redis_timeout_s) if settings.redis_url else None
        # `/v1/responses`' stored responses (router/api/responses.py), in Redis when there is one
        self.responses = ResponseStore(self.store.client if self.store else None, settings.responses_ttl_s)
        self.sync = SnapshotSync(default_policy(self.pools.names), self.store, self.pools, self.metrics,
                                 settings.stats_interval_s)
        self.classifier = Classifier(self.metrics, classify)
        self.dispatcher = Dispatcher(self.pools, self.metrics, settings.max_attempts)
        hash_secret = settings.key_hash_secret.get_secret_value() if settings.key_hash_secret else None
        self.keys = KeyManager(settings.api_keys, settings.api_key_limits, self.store, self.metrics,
                               settings.stats_interval_s, hash_secret)
        self.decisions: Counter[tuple[str, str, str]] = Counter()
        self.conversations = Conversations(self.store.client if self.store is not None else None,
                                           settings.conversation_ttl_s, lambda _: self.metrics.redis_errors.inc())
        self.conversation_header = settings.conversation_header.lower().encode("latin-1")
        self.shadow_rng = random.Random(settings.seed)   # the shadow's draws leave the live ones unchanged
        self.shadow_tally = ShadowTally()
        self._feedback: FeedbackWriter | None = None
        self.predictor = (PredictorTrainer(
            self.store.client, check_s=settings.predictor_check_s, retrain_s=settings.predictor_retrain_s,
            records=settings.predictor_records, min_records=settings.predictor_min_records,
            ridge=settings.predictor_ridge, prior_weight=settings.predictor_prior_weight,
            on_error=lambda _exc: self.metrics.redis_errors.inc()) if self.store is not None and settings.predictor
            else None)
        self.series = SeriesSampler(self.store, settings.timeseries_interval_s, settings.timeseries_retention_s,
                                    self._mal_cells, self.sync.redis_error)
        self.tracing = make_tracing(settings.tracing, settings.trace_exporter, settings.otlp_endpoint)
        self.access_log = (AccessLog(settings.access_log_sample, settings.access_log_file)
                           if settings.access_log else None)
        self._tasks: list[asyncio.Task[None]] = []
        self.started_at = time.time()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks += await self.classifier.start()
        await self.pools.start()
        self._tasks += await self.sync.start()
        self._tasks += await self.keys.start()
        self._tasks += self.series.start()
        if self.predictor is not None:
            self._tasks += self.predictor.start()
        if self.store is not None and self.settings.gateway_feedback:
            self._feedback = FeedbackWriter(self.store.client, on_error=self._feedback_lost)
            self._tasks.append(self._feedback.start())
        self.metrics.policy_version.set(self.snapshot.policy.version)

    async def close(self) -> None:
        """Stop every background task (refresh, policy listener, feedback, classifier retry) and wait
        for it, then close the pools (health/Load poller, channels) and the Redis client."""
        self.sync.closing = self.classifier.closing = self.keys.closing = self.series.closing = True
        if self.predictor is not None:
            self.predictor.closing = True
        try:
            await self.conversations.flush()
            await stop_tasks(self._tasks)
            self._tasks.clear()
        finally:
            await self.keys.close()
            await self.pools.close()
            if self.store is not None:
                await self.store.close()
            if self.access_log is not None:
                self.access_log.close()
            if self.tracing is not None:
                self.tracing.provider.shutdown()  # exports what is still batched

    @property
    def snapshot(self) -> Snapshot:
        return self.sync.snapshot

    @property
    def redis_ok(self) -> bool:
        return self.sync.redis_ok

    def readiness(self) -> Readiness:
        """ready / degraded (serving, but a pool or Redis is down) / not ready (router/readiness.py)."""
        loaded = self.classifier.fn is not None
        return assess(classifier_error=None if loaded else str(self.classifier.error or "loading"),
                      pools=self.pools.states(), policy=self.snapshot.policy,
                      redis_configured=self.store is not None, redis_ok=self.redis_ok)

    # -- policy writes (admin) -----------------------------------------------------------------
    async def current_policy(self) -> Policy:
        """The stored policy (the snapshot's when there is no store or nothing stored yet)."""
        if self.store is not None:
            try:
                cur = await self.store.get()
            except Exception as exc:  # Redis down: the caller may fall back to the snapshot
                self.metrics.redis_errors.inc()
                raise StoreUnavailable(exc) from exc
            if cur is not None:
                return cur
        return self.snapshot.policy

    async def put_policy(self, new: Policy, expected_version: int, actor: str, action: str = "put",
                         note: str = "", audit: Mapping[str, Any] | None = None) -> Policy:
        """Write `new` as the next version if the stored one is `expected_version`, and apply it here
        at once (`audit`: extra fields of the history entry). Raises `StoreNotConfigured`,
        `VersionConflict` or `StoreUnavailable`."""
        if self.store is None:
            raise StoreNotConfigured()
        try:
            current = await self.store.get()
            written = await self.store.put(new, expected_version, actor, action, note, old=current, audit=audit)
        except (RedisError, OSError) as exc:
            self.sync.redis_error(exc)
            raise StoreUnavailable(exc) from exc
        self.sync.wrote_policy(written)
        return written

    async def policy_versions(self, limit: int) -> list[dict[str, Any]]:
        """Newest first; empty without a store."""
        if self.store is None:
            return []
        return await self._read(self.store.versions(limit))

    async def policy_version(self, version: int) -> dict[str, Any] | None:
        if self.store is None:
            raise StoreNotConfigured()
        return await self._read(self.store.version(version))

    async def _read(self, op: Awaitable[T]) -> T:
        try:
            return await op
        except Exception as exc:
            self.metrics.redis_errors.inc()
            raise StoreUnavailable(exc) from exc

    # -- request path --------------------------------------------------------------------------
    def classify(self, messages: list[dict[str, str]]) -> Classification:
        return self.classifier(messages)

    def route(self, probs: Mapping[str, float], uncertainty: float, allowed: Sequence[str] = (),
              context: RequestContext | None = None, turn: Turn | None = None,
              features: Sequence[float] = ()) -> Routed:
        """The pool for a request; `allowed` (an API key's pools, empty: all) limits where it may go;
        `turn`: the conversation it continues (router/routing/conversation.py); `features`: the prompt
        part of its features (router/routing/features.py). The shadow policy, if any, decides beside it
        (not served; router/routing/shadow.py)."""
        snap = self.snapshot
        predictor = self.predictor.current if self.predictor is not None else None
        states = self.pools.states()
        if allowed:
            states = {p: st if p in allowed else PoolState(healthy=False) for p, st in states.items()}
        d = fresh = decide(probs, uncertainty, snap.cells, states, snap.policy, self.rng, context, features, predictor)
        verdict = None
        if turn is not None:
            pol = snap.policy
            usable = [p for p, st in states.items() if st.healthy and p in pol.pools and p not in pol.drained]
            means = {p: g for p in (turn.sticky.pool, d.pool) if p is not None and p in d.scores
                     and (g := predicted_goodput(p, d, snap.cells, states, pol.learning)) is not None}
            verdict = stick(d, turn.sticky, turn.history_tokens, turn.expected_tokens, means,
                            self.conversations.prefill.ms_per_token, self.settings.conversation_prefill_ms, usable)
            self.metrics.conversation_routes_by(turn.sticky.pool, verdict.why).inc()
            if verdict.stay:
                d = sticky_decision(d, turn.sticky)
        self.decisions[(d.domain, d.pool or "none", d.reason)] += 1
        self.metrics.route_decisions_by(d.domain, d.pool or "none", d.reason).inc()
        if d.reason == "fallback" or d.pool is None:  # a pool is down or drained: count it as a fallback
            labels = policy_fallback(d, snap.policy, states, uncertainty)
            if labels is not None:
                self.metrics.fallbacks_by(*labels).inc()
        shadow = None
        if snap.shadow is not None:
            sd = decide(probs, uncertainty, snap.cells, states, snap.shadow.policy, self.shadow_rng, context,
                        features, predictor)
            shadow = compare(fresh, sd, snap.cells, states, snap.policy.learning)
            if self.shadow_tally.shadow_id != snap.shadow.id:
                self.shadow_tally = ShadowTally(snap.shadow.id)
            self.shadow_tally.add(shadow)
            self.metrics.shadow_decisions_by(shadow.live_pool or "none", shadow.shadow_pool or "none").inc()
            log.debug("shadow %s: %s -> live %s, shadow %s (%s)", snap.shadow.id, d.domain, fresh.pool, sd.pool,
                      sd.reason)
        return Routed(d, verdict, shadow)

    def shadow_view(self) -> dict[str, Any]:
        """The shadow policy and this gateway's comparison of it with the live one."""
        doc = self.snapshot.shadow
        if doc is None:
            return {"shadow": None, "live_version": self.snapshot.policy.version}
        tally = self.shadow_tally if self.shadow_tally.shadow_id == doc.id else ShadowTally(doc.id)
        return {"shadow": doc.view(), "live_version": self.snapshot.policy.version, "comparison": tally.view()}

    async def open(self, decision: Decision, req: engine_pb2.GenerateRequest, *, deadline: float, batch: str = "",
                   allowed: Sequence[str] = (), metadata: tuple[tuple[str, str], ...] | None = None,
                   unary: bool = False, prefer: str | None = None) -> Upstream:
        """The worker call for `decision`, along the policy's fallback order (raises `UpstreamError`);
        `allowed` (an API key's pools, empty: all) limits the retries; `unary`: the whole answer at once;
        `prefer`: the address of the decision's pool's endpoint to try first (a conversation's worker)."""
        order = fallback_order(self.snapshot.policy, decision.pool)
        if allowed:
            order = [p for p in order if p in allowed]
        up = await self.dispatcher.open(order, req, deadline, batch=batch, metadata=metadata, unary=unary,
                                        prefer=prefer)
        if up.call is not None:  # a stream: if its worker fails, it continues on another (router/workers/migrate.py)
            up.resume = Migration(self.dispatcher, self.metrics, order, req, deadline, batch, metadata)
        return up

    def _feedback_lost(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.sync.redis_error(exc)

    def feedback(self, rec: FeedbackRecord) -> None:
        if self._feedback is not None:
            self._feedback.put(rec)

    # -- introspection ---------------------------------------------------------------------------
    def served_models(self) -> list[str]:
        names = [self.settings.model_name] if self.settings.model_name else self.pools.model_ids()
        return list(dict.fromkeys([*names, *self.settings.model_aliases]))

    def model_known(self, name: str) -> bool:
        models = self.served_models()
        real = [m for m in models if m not in self.settings.model_aliases]
        return name in models or not real  # nothing known yet: let routing decide (503 if no worker)

    def _mal_cells(self) -> dict[tuple[str, str], float]:
        cells = {cell: s.mean_accepted_length for cell, s in self.snapshot.stats.items()}
        return {cell: v for cell, v in cells.items() if v is not None}

    def stats_view(self) -> dict[str, Any]:
        return stats_view(self.snapshot, self.decisions, self.redis_ok, time.time())

    def pools_view(self) -> dict[str, Any]:
        return pools_view(self.pools.pools, self.pools.states(), self.snapshot.policy.drained)
