"""Per-pod balancing from DNS (router/workers/discovery.py): a pool member `dns:///NAME:PORT` becomes one
endpoint per address NAME resolves to, re-resolved while the gateway runs.

Real parts: every "pod" is a fake engine worker (tests/router/fake_engine.py) on its own loopback
address (127.0.0.2, .3, ... all on one port, as pods behind a headless Service are); the gateway is the
real app; only the resolver is injected (it answers what a headless Service's A records would).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import router.workers.discovery as discovery
from router.settings import parse_pools
from router.workers.discovery import DnsDiscovery, DnsTarget, endpoint_address, parse_dns, system_resolver
from router.workers.pools import PoolManager
from specroute.v1 import engine_pb2_grpc
from tests.router.conftest import ADMIN, running_app, settings_for
from tests.router.fake_engine import FakeConfig, FakeEngine

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
NAME = "workers.specroute.svc.cluster.local"


class Pod(FakeEngine):
    """A fake worker bound to its own loopback IP (a pod IP)."""

    def __init__(self, ip: str, port: int = 0) -> None:
        super().__init__(FakeConfig(name=ip), port)
        self.ip = ip

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    async def start(self) -> Pod:
        self.server = grpc.aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{self.ip}:{self.port}")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        return self


class FakeDns:
    """The A records of one name; `calls` counts lookups; `fail` makes the next lookups raise."""

    def __init__(self, ips: list[str]) -> None:
        self.ips = list(ips)
        self.calls = 0
        self.fail = False

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        if self.fail:
            raise OSError(f"[Errno -3] Temporary failure in name resolution: {host}")
        assert host == NAME
        return list(self.ips)


@contextlib.asynccontextmanager
async def pods(n: int) -> AsyncIterator[list[Pod]]:
    """`n` workers on 127.0.0.2.. sharing one port (the first picks a free one)."""
    started: list[Pod] = []
    try:
        first = await Pod("127.0.0.2").start()
        started.append(first)
        for i in range(1, n):
            started.append(await Pod(f"127.0.0.{2 + i}", first.port).start())
        yield started
    finally:
        for p in started:
            await p.stop()


async def wait_for(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


def served(ps: list[Pod]) -> list[int]:
    return [len(p.servicer.requests) for p in ps]


# --- parsing -------------------------------------------------------------------------------------


async def test_dns_members_parse_and_split_from_static_ones() -> None:
    assert parse_dns("mtp", f"dns:///{NAME}:50051") == DnsTarget("mtp", NAME, 50051)
    for bad in ("dns:///svc", "dns:///svc:0", "dns://8.8.8.8/svc:50051", "svc:50051"):
        with pytest.raises(ValueError, match="dns:///HOST:PORT"):
            parse_dns("mtp", bad)
    pools = parse_pools(f"mtp=dns:///{NAME}:50051,10.1.2.3:50051;dfly=dns:///dfly:7")
    static, d = DnsDiscovery.split(pools, lambda p, a: None)  # type: ignore[arg-type,return-value]
    assert static == {"mtp": ["10.1.2.3:50051"], "dfly": []}
    assert [t.spec for t in d.targets] == [f"dns:///{NAME}:50051", "dns:///dfly:7"]
    with pytest.raises(ValueError, match="dns:///HOST:PORT"):
        parse_pools("mtp=dns:///svc")
    assert endpoint_address("10.0.0.7", 50051) == "10.0.0.7:50051"
    assert endpoint_address("fd00::7", 50051) == "[fd00::7]:50051"


async def test_system_resolver_answers_for_localhost() -> None:
    assert "127.0.0.1" in await system_resolver("localhost", 50051)


# --- the pool manager ----------------------------------------------------------------------------


async def test_manager_tracks_resolved_addresses_and_closes_removed_channels() -> None:
    async with pods(3) as ps:
        dns = FakeDns([p.ip for p in ps[:2]])
        pm = PoolManager({"mtp": [f"dns:///{NAME}:{ps[0].port}"]}, resolver=dns, dns_refresh_s=0.05,
                         health_interval_s=0.05)
        await pm.start()
        try:
            assert sorted(e.address for e in pm.pools["mtp"]) == [ps[0].address, ps[1].address]
            assert all(e.healthy for e in pm.pools["mtp"]) and pm.states()["mtp"].endpoints == 2
            first = {e.address: e for e in pm.pools["mtp"]}

            dns.ips = [ps[1].ip, ps[2].ip]  # a pod replaced: .2 gone, .4 new
            await wait_for(lambda: sorted(e.address for e in pm.pools["mtp"]) == [ps[1].address, ps[2].address])
            assert first[ps[1].address] in pm.pools["mtp"]  # the survivor keeps its channel and state
            assert first[ps[0].address].channel is None  # the removed one's channel is closed
            assert pm.pick("mtp") in pm.pools["mtp"]

            dns.fail = True  # a DNS outage keeps the last known endpoints
            calls = dns.calls
            await wait_for(lambda: dns.calls > calls + 2)
            assert len(pm.pools["mtp"]) == 2 and pm.states()["mtp"].healthy
        finally:
            await pm.close()
        assert all(e.channel is None for e in pm.pools["mtp"])


async def test_removed_endpoint_keeps_its_channel_until_its_calls_finish() -> None:
    async with pods(2) as ps:
        dns = FakeDns([p.ip for p in ps])
        pm = PoolManager({"mtp": [f"dns:///{NAME}:{ps[0].port}"]}, resolver=dns, dns_refresh_s=3600)
        await pm.start()
        try:
            busy = next(e for e in pm.pools["mtp"] if e.address == ps[0].address)
            busy.inflight = 1  # a stream is still running on it
            dns.ips = [ps[1].ip]
            await pm.discovery.refresh(pm)
            assert busy not in pm.pools["mtp"] and busy.channel is not None and pm.discovery.retired == [busy]
            busy.inflight = 0
            await pm.discovery.refresh(pm)
            assert busy.channel is None and pm.discovery.retired == []
        finally:
            await pm.close()


# --- through the gateway -------------------------------------------------------------------------


async def test_gateway_spreads_requests_over_pods_and_stops_sending_to_dead_or_removed_ones(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with pods(3) as ps:
        dns = FakeDns([p.ip for p in ps])
        monkeypatch.setattr(discovery, "system_resolver", dns)
        settings = settings_for({"mtp": [f"dns:///{NAME}:{ps[0].port}"]}, redis_url, dns_refresh_s=0.1)
        async with running_app(settings) as c:
            view = (await c.get("/admin/pools", headers=ADMIN)).json()["mtp"]
            assert sorted(e["address"] for e in view["endpoints"]) == sorted(p.address for p in ps)
            assert view["available_endpoints"] == 3

            for _ in range(30):
                assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            spread = served(ps)
            assert sum(spread) == 30 and min(spread) >= 3, spread  # every pod serves, none takes all

            await ps[0].stop()  # a pod dies (still in DNS): health checks take it out
            await wait_for(lambda: c.app.state.gateway.pools.states()["mtp"].endpoints == 2)  # type: ignore[attr-defined]
            before = served(ps)
            for _ in range(20):
                assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            after = served(ps)
            assert after[0] == before[0] and after[1] > before[1] and after[2] > before[2], (before, after)

            dns.ips = [ps[1].ip]  # scaled down: .4 leaves the Service
            await wait_for(lambda: [e["address"] for e in c.app.state.gateway.pools_view()["mtp"]["endpoints"]]  # type: ignore[attr-defined]
                           == [ps[1].address])
            before = served(ps)
            for _ in range(10):
                assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            after = served(ps)
            assert after[1] == before[1] + 10 and after[2] == before[2], (before, after)
