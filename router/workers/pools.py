"""Worker pools: their endpoints (router/workers/endpoint.py), the health/`Load` poller, which
endpoint takes a request (the least loaded, with batch affinity: router/routing/affinity.py), and a
pool's state for the policy (`states`, `speculation`).

A worker serving several engine modes over one target (`specroute worker --engine mtp,dfly,ar`) can
be a member of several pools, one per mode (`--pool-mode NAME=MODE`); the pools on one address share
its `WorkerLoad`, so each balances on every pool's requests in flight there.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Mapping

from router.routing.affinity import Candidate, choose
from router.routing.estimate import PoolState
from router.tasks import run_every, stop_tasks
from router.workers.discovery import DnsDiscovery, Resolver
from router.workers.endpoint import Endpoint, WorkerLoad
from specroute.pools import non_speculative

log = logging.getLogger("specroute.gateway.pools")


def speculation(eps: Iterable[Endpoint], now: float, plain: frozenset[str] | None = None
                ) -> tuple[bool, float | None, float | None]:
    """Whether a pool speculates (False only when every available endpoint runs an engine kind that
    never drafts, e.g. `ar`), the drafts per step its D-Cut keeps now (kept ratio x block size,
    averaged over the endpoints with D-Cut on; None when none has it on), and the tokens per forward
    where its steps turn compute-bound (mean over the endpoints that measured it; None if none did).
    `plain`: the engine kinds that never draft (specroute/pools.py `non_speculative`)."""
    plain = non_speculative() if plain is None else plain
    seen = spec = False
    kept: list[float] = []
    bound: list[float] = []
    for e in eps:
        if not e.available(now):
            continue
        seen = True
        info, load = e.info, e.load
        spec = spec or info is None or e.engine not in plain
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

        # `dns:///HOST:PORT` members: one endpoint per resolved address, kept current (router/workers/discovery.py)
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
        plain = non_speculative()
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
            spec, draft_now, bound = speculation(eps, now, plain)
            out[name] = PoolState(healthy=n > 0, running=running, waiting=waiting, max_running=max_running,
                                  endpoints=n, speculative=spec, draft_now=draft_now, compute_bound_tokens=bound)
        return out

    def pick(self, pool: str, exclude: set[Endpoint] | None = None, batch: str = "",
             prefer: str | None = None) -> Endpoint | None:
        """The available endpoint of `pool` for a request of batch kind `batch`: the one at address `prefer`
        (a conversation's worker) when it is available; else the least loaded, or within `affinity_slack`
        rows of it the one whose worker runs fewest rows of another kind (router/routing/affinity.py);
        random among ties."""
        now = time.monotonic()
        eps = [e for e in self.pools.get(pool, ()) if not (exclude and e in exclude) and e.available(now)]
        if prefer is not None:
            for e in eps:
                if e.address == prefer:
                    return e
        cands = [Candidate(e.score(), 1.0 / e.capacity(), e.worker.batches[batch], e.worker.inflight) for e in eps]
        best = [eps[i] for i in choose(cands, self.affinity_slack if batch else 0.0)]
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
