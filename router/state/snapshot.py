"""The local policy/statistics snapshot and the background tasks that keep it fresh.

The request path only reads `SnapshotSync.snapshot` (an immutable object swapped whole) and never
awaits Redis. Two tasks maintain it: a periodic pull of policy and statistics (`refresh`, every
`stats_interval_s`: the global and recently updated level cells, router/state/stats.py), and a
pub/sub listener that applies a new policy the moment any gateway writes one. Redis down means a stale snapshot, `redis_ok = False` and a metric.
The pull also reads the shadow policy, if any (router/state/shadow.py).
Pulls of the last `drift_window_s` seconds (at most `HISTORY_PULLS`) are kept for change detection
(router/routing/drift.py): a cell whose recent evidence disagrees with its past is learned from on what came
since the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from router.observability.metrics import Metrics
from router.routing.drift import Baselines, adjust
from router.routing.policy import Policy
from router.state.shadow import ShadowDoc, load_shadow
from router.state.stats import domain_cells, migrate_v1, pull_cells
from router.state.store import EVENTS_CHANNEL, PolicyStore, parse_policy
from router.tasks import run_every
from router.workers.pools import PoolManager
from specroute.contracts.feedback import CellStats
from specroute.redis_url import migrate_legacy_names

log = logging.getLogger("specroute.gateway")

REDIS_FAILURES = (TimeoutError, RedisError, OSError)
HISTORY_PULLS = 60   # pulls kept for change detection (router/routing/drift.py), spread over its window


@dataclass(frozen=True, slots=True)
class Snapshot:
    policy: Policy
    stats: Mapping[tuple[str, str], CellStats] = field(default_factory=dict)  # (domain, pool): the domain cells
    fetched_at: float = 0.0  # local wall clock of the last successful pull (0 = never)
    # what the policy learns from: every pulled cell, (level, pool); a shifted group's cells cut to what
    # came since its change (router/routing/drift.py)
    cells: Mapping[tuple[str, str], CellStats] = field(default_factory=dict)
    shifted: frozenset[tuple[str, str]] = frozenset()   # (domain or "*", pool) judged on evidence since a change
    shadow: ShadowDoc | None = None   # the candidate policy deciding beside the live one (router/state/shadow.py)


class SnapshotSync:
    """Owns the snapshot: applies policies (from pulls, events and this gateway's own writes) and
    ages pulled statistics to Redis' clock."""

    def __init__(self, initial: Policy, store: PolicyStore | None, pools: PoolManager, metrics: Metrics,
                 interval_s: float) -> None:
        self.snapshot = Snapshot(initial)
        self.store = store
        self.pools = pools
        self.metrics = metrics
        self.interval_s = interval_s
        self.redis_ok = False
        self.closing = False  # set on shutdown: both loops exit at their next check
        self.history: deque[tuple[float, Mapping[tuple[str, str], CellStats]]] = deque()  # (Redis time, cells)
        self.baselines: Baselines = {}
        self.writes = 0   # this gateway's own policy and shadow writes applied so far (`wrote_*`)

    async def start(self) -> list[asyncio.Task[None]]:
        """Seed or read the stored policy, pull once, then start the refresh and listen tasks."""
        if self.store is None:
            return []
        try:
            renamed, kept = await migrate_legacy_names(self.store.client)
            if renamed or kept:
                log.info("redis: %d keys moved to the {specroute} hash tag; %d left (new name taken): %s",
                         renamed, len(kept), ", ".join(kept))
            self.apply_policy(await self.store.init(self.snapshot.policy), force=True)
            moved = await migrate_v1(self.store.client)
            if moved:
                log.info("statistics: %d per-domain cells of the retired layout moved to the one schema", moved)
            await self.refresh()
        except (RedisError, OSError) as exc:
            self.redis_error(exc)
        refresh = run_every(self.interval_s, self._refresh_step, lambda: self.closing, "refresh loop")
        return [asyncio.create_task(refresh, name="specroute-refresh"),
                asyncio.create_task(self._listen_loop(), name="specroute-policy-events")]

    def redis_error(self, exc: BaseException) -> None:
        self.metrics.redis_errors.inc()
        if self.redis_ok:
            log.warning("redis unavailable, serving on the last snapshot: %s", exc)
        self.redis_ok = False

    def wrote_policy(self, policy: Policy) -> None:
        """Apply the policy this gateway has just written to Redis (see `refresh`)."""
        self.writes += 1
        self.apply_policy(policy, force=True)

    def wrote_shadow(self, shadow: ShadowDoc | None) -> None:
        """Apply the shadow policy this gateway has just written or cleared in Redis (see `refresh`)."""
        self.writes += 1
        self.apply_shadow(shadow)

    def apply_policy(self, policy: Policy | None, *, force: bool = False) -> None:
        """Swap in `policy` if it differs (and, unless `force`, is newer than the current one)."""
        cur = self.snapshot.policy
        if policy is None or policy == cur or (not force and policy.version <= cur.version):
            return
        log.info("policy version %d applied", policy.version)
        self.snapshot = dataclasses.replace(self.snapshot, policy=policy)
        self.metrics.policy_version.set(policy.version)

    def apply_shadow(self, shadow: ShadowDoc | None) -> None:
        """Swap in the shadow policy (None: there is none)."""
        if shadow != self.snapshot.shadow:
            self.snapshot = dataclasses.replace(self.snapshot, shadow=shadow)

    async def refresh(self) -> None:
        """Pull policy and statistics once (about every second from the refresh loop). Redis is the
        source of truth (its policy replaces this gateway's whatever the version), except across this
        gateway's own write: what a pull read before the write is older than what the write applied."""
        assert self.store is not None
        writes = self.writes
        policy = await self.store.pull()
        if policy is None:  # Redis lost its data (restart without persistence): re-seed it
            policy = await self.store.init(self.snapshot.policy)
        if self.writes == writes:
            self.apply_policy(policy, force=True)
        pools = list(dict.fromkeys([*self.snapshot.policy.pools, *self.pools.names]))
        now, pulled = await pull_cells(self.store.client, pools)
        hl = self.snapshot.policy.half_life_s
        cells = {cell: s.decayed_to(now, hl) for cell, s in pulled.items()}
        aged = domain_cells(cells)
        learning = self.snapshot.policy.learning
        view = adjust(cells, self.history, self.baselines, now, hl, learning)
        for group in view.baselines.keys() - self.baselines.keys():
            log.info("learning: %s on %s changed; judged on the evidence since", *group)
            self.metrics.learning_shifts.labels(*group).inc()
        self.baselines = view.baselines
        self._remember(now, cells, learning.drift_window_s)
        shadow = await load_shadow(self.store)
        if self.writes != writes:
            shadow = self.snapshot.shadow
        self.snapshot = Snapshot(self.snapshot.policy, aged, time.time(), view.cells, view.shifted, shadow)
        for (d, p), s in aged.items():
            mal = s.mean_accepted_length
            if mal is not None:
                self.metrics.pool_mean_accepted_length.labels(d, p).set(mal)
        if not self.redis_ok:
            log.info("redis reachable")
        self.redis_ok = True

    def _remember(self, now: float, cells: Mapping[tuple[str, str], CellStats], window: float) -> None:
        """Keep pulls over the last `window` seconds for change detection, at most `HISTORY_PULLS` of
        them (spaced by window / HISTORY_PULLS): a bounded memory whatever the pull interval."""
        while self.history and (self.history[0][0] < now - window or self.history[0][0] > now):
            self.history.popleft()   # too old, or Redis' clock went back
        if window > 0 and (not self.history or now - self.history[-1][0] >= window / HISTORY_PULLS):
            self.history.append((now, cells))

    async def _refresh_step(self) -> None:
        try:
            await self.refresh()
        except REDIS_FAILURES as exc:
            self.redis_error(exc)
        except Exception:  # pragma: no cover
            log.exception("refresh loop")
        for name, st in self.pools.states().items():
            self.metrics.pool_healthy_endpoints.labels(name).set(st.endpoints)
        if self.snapshot.fetched_at:
            self.metrics.snapshot_age_seconds.set(time.time() - self.snapshot.fetched_at)

    async def _listen_loop(self) -> None:
        assert self.store is not None
        while not self.closing:
            client = self.store.pubsub_client()
            ps = client.pubsub(ignore_subscribe_messages=True)
            try:
                await ps.subscribe(EVENTS_CHANNEL)
                # close the gap between subscribing and the last pull: anything written before now
                self.apply_policy(await self.store.get())
                while not self.closing:
                    msg = await ps.get_message(timeout=5.0)
                    if msg and msg.get("type") == "message":
                        try:
                            self.apply_policy(parse_policy(msg["data"]))
                        except ValueError as exc:
                            log.error("ignoring invalid policy event: %s", exc)
            except REDIS_FAILURES as exc:
                if self.closing:
                    return
                self.redis_error(exc)
                await asyncio.sleep(min(1.0, self.interval_s))
            finally:
                with contextlib.suppress(Exception):
                    await ps.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()
