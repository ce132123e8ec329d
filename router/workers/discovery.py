"""Per-pod endpoints from DNS: a pool member `dns:///HOST:PORT` stands for every address HOST resolves to.

In Kubernetes a pool is a Deployment behind a headless Service (`clusterIP: None`): the Service name
resolves to one A record per ready pod. One gRPC channel to the name would stick to a single pod
(pick-first); instead the gateway resolves the name itself, keeps one `Endpoint` per address (its own
channel, health check, breaker and load, so `PoolManager.pick` balances least-loaded over the healthy
pods) and re-resolves every `refresh_s` seconds:

* a new address gets an endpoint (connected and health-checked before it can be picked);
* an address that is gone leaves the pool at once (no new requests); its channel closes when its
  in-flight requests have finished;
* a failed lookup keeps the last known set (a DNS hiccup must not empty a pool); the health checks
  still take dead pods out of rotation.

`HOST:PORT` members are static, as before. The resolver is injectable (tests serve several
127.0.0.x addresses); the default asks the system resolver (`getaddrinfo`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.tasks import run_every, stop_tasks

if TYPE_CHECKING:
    from router.workers.endpoint import Endpoint
    from router.workers.pools import PoolManager

log = logging.getLogger("specroute.gateway.discovery")

DNS_SCHEME = "dns:///"

# (host, port) -> the addresses (IP literals) the host resolves to now; raises OSError on failure
Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True)
class DnsTarget:
    pool: str
    host: str
    port: int

    @property
    def spec(self) -> str:
        return f"{DNS_SCHEME}{self.host}:{self.port}"


def is_dns(member: str) -> bool:
    return member.startswith(DNS_SCHEME)


def parse_dns(pool: str, member: str) -> DnsTarget:
    """`dns:///HOST:PORT` -> DnsTarget (ValueError on anything else)."""
    rest = member[len(DNS_SCHEME):] if is_dns(member) else ""
    host, _, port = rest.rpartition(":")
    if not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"pool {pool!r}: {member!r} must look like dns:///HOST:PORT")
    return DnsTarget(pool, host, int(port))


def endpoint_address(ip: str, port: int) -> str:
    """A gRPC target for one resolved address (IPv6 literals in brackets)."""
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (A and AAAA), in a stable order, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


EndpointFactory = Callable[[str, str], "Endpoint"]  # (pool, address) -> a new, unconnected endpoint


class DnsDiscovery:
    """Keeps the DNS-backed members of a `PoolManager`'s pools in step with what their names resolve to."""

    def __init__(self, targets: Iterable[DnsTarget], make_endpoint: EndpointFactory,
                 resolver: Resolver | None = None, refresh_s: float = 5.0) -> None:
        self.targets = list(targets)
        self.make_endpoint = make_endpoint
        self.resolver: Resolver = resolver or system_resolver
        self.refresh_s = refresh_s
        self.resolved: dict[DnsTarget, list[str]] = {}  # last successful answer per target
        self.owned: dict[str, dict[str, Endpoint]] = {}  # pool -> address -> the endpoint discovery made
        self.retired: list[Endpoint] = []  # out of their pool, channel open until in-flight calls end
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @classmethod
    def split(cls, pools: Mapping[str, Iterable[str]], make_endpoint: EndpointFactory,
              resolver: Resolver | None = None, refresh_s: float = 5.0) -> tuple[dict[str, list[str]], DnsDiscovery]:
        """(pool -> its static `HOST:PORT` members, the discovery for the `dns:///` ones); every pool
        keeps its key even when all its members come from DNS."""
        static: dict[str, list[str]] = {}
        targets: list[DnsTarget] = []
        for name, members in pools.items():
            static[name] = []
            for m in members:
                if is_dns(m):
                    targets.append(parse_dns(name, m))
                else:
                    static[name].append(m)
        return static, cls(targets, make_endpoint, resolver, refresh_s)

    async def _resolve(self, t: DnsTarget) -> list[str] | None:
        try:
            ips = await self.resolver(t.host, t.port)
        except (OSError, ValueError) as exc:
            log.warning("cannot resolve %s (pool %s): %s; keeping %d known endpoint(s)",
                        t.spec, t.pool, exc, len(self.resolved.get(t, [])))
            return None
        return sorted({endpoint_address(ip, t.port) for ip in ips})

    async def refresh(self, manager: PoolManager) -> None:
        """Resolve every target once and add/remove endpoints to match."""
        answers = await asyncio.gather(*(self._resolve(t) for t in self.targets))
        for t, addrs in zip(self.targets, answers, strict=True):
            if addrs is not None:
                self.resolved[t] = addrs
        for pool in dict.fromkeys(t.pool for t in self.targets):
            owned = self.owned.setdefault(pool, {})
            current = manager.pools.get(pool, [])
            static = {e.address for e in current if e not in owned.values()}
            wanted = {a for t in self.targets if t.pool == pool for a in self.resolved.get(t, [])} - static
            gone = [e for a, e in owned.items() if a not in wanted]
            fresh = [self.make_endpoint(pool, a) for a in sorted(wanted - owned.keys())]
            if not gone and not fresh:
                continue
            for e in fresh:
                e.connect()
            # health-checked before they can be picked; then the pool's list is swapped in one step
            try:
                await asyncio.gather(*(e.check(manager.health_timeout_s) for e in fresh))
            except BaseException:  # cancelled (shutdown) mid-check: the new channels are nobody's yet
                await asyncio.gather(*(e.close() for e in fresh), return_exceptions=True)
                raise
            for e in gone:
                del owned[e.address]
            owned.update((e.address, e) for e in fresh)
            manager.pools[pool] = [e for e in manager.pools.get(pool, []) if e not in gone] + fresh
            self.retired += gone
            log.info("pool %s: %d endpoint(s) from DNS %s (added %s, removed %s)", pool, len(owned),
                     sorted(owned), [e.address for e in fresh], [e.address for e in gone])
        await self._close_idle()

    async def _close_idle(self, force: bool = False) -> None:
        idle = [e for e in self.retired if force or e.inflight <= 0]
        self.retired = [e for e in self.retired if e not in idle]
        await asyncio.gather(*(e.close() for e in idle), return_exceptions=True)

    async def start(self, manager: PoolManager) -> None:
        """Resolve once now, then every `refresh_s` seconds until `close()`."""
        if not self.targets:
            return
        await self.refresh(manager)
        self._task = asyncio.create_task(
            run_every(self.refresh_s, lambda: self.refresh(manager), lambda: self._closing, "dns refresh"),
            name="specroute-pool-dns")

    async def close(self) -> None:
        """Stop re-resolving and close the channels of endpoints already removed (the manager closes
        the ones still in its pools)."""
        self._closing = True
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None
        await self._close_idle(force=True)
