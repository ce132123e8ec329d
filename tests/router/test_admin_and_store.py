"""Admin API and the Redis-backed policy store: ETag/If-Match, validation, history, rollback, audit,
live propagation between two gateways, learning from feedback, and Redis outages."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.redis_server import RedisServer
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

CODE_REQ = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 8}


async def _policy(client: httpx.AsyncClient) -> tuple[dict, str]:
    r = await client.get("/admin/policy", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json(), r.headers["etag"]


async def _put(client: httpx.AsyncClient, doc: dict, etag: str | None) -> httpx.Response:
    headers = dict(ADMIN)
    if etag is not None:
        headers["if-match"] = etag
    return await client.put("/admin/policy", json=doc, headers=headers)


async def test_admin_auth(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url)) as c:
        assert (await c.get("/admin/policy")).status_code == 401
        assert (await c.get("/admin/policy", headers={"authorization": "Bearer wrong"})).status_code == 401
        assert (await c.get("/admin/pools", headers=ADMIN)).status_code == 200
    # without a token the admin routes are not mounted at all
    async with engines(FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url, admin_tokens="")
    ) as c:
        assert (await c.get("/admin/policy")).status_code == 404


async def test_policy_put_etag_history_rollback(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
    ) as c:
        doc, etag = await _policy(c)
        assert doc["version"] == 1 and etag == '"1"'
        assert doc["defaults"] == {"chat": "mtp", "code": "dfly", "math": "dfly"} and doc["safe_pool"] == "mtp"

        r = await _put(c, {**doc, "exploration_rate": 0.2}, None)
        assert r.status_code == 428
        r = await _put(c, {**doc, "pins": {"code": "nowhere"}}, etag)
        assert r.status_code == 400 and "unknown pool 'nowhere'" in r.json()["error"]["message"]
        r = await _put(c, {**doc, "exploration_rate": 0.2}, etag)
        assert r.status_code == 200 and r.headers["etag"] == '"2"' and r.json()["exploration_rate"] == 0.2
        # a stale write loses
        r = await _put(c, {**doc, "exploration_rate": 0.3}, etag)
        assert r.status_code == 412 and r.json()["error"]["code"] == "version_conflict"
        assert c.app.state.gateway.snapshot.policy.version == 2  # type: ignore[attr-defined]

        v = await c.post("/admin/policy/validate", json={**doc, "drained": ["mtp"]}, headers=ADMIN)
        body = v.json()
        assert body["valid"] and any("safe_pool" in w for w in body["warnings"])
        assert {"path": "drained", "old": [], "new": ["mtp"]} in body["diff"]
        v = await c.post("/admin/policy/validate", json={**doc, "exploration_rate": 7}, headers=ADMIN)
        assert v.json()["valid"] is False and v.json()["errors"]

        r = await c.post("/admin/policy/rollback", json={"version": 1}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["version"] == 3 and r.json()["exploration_rate"] == 0.05
        r = await c.post("/admin/policy/rollback", json={"version": 99}, headers=ADMIN)
        assert r.status_code == 404

        hist = (await c.get("/admin/policy/versions", headers=ADMIN)).json()["versions"]
        assert [h["version"] for h in hist] == [3, 2, 1]
        assert [h["action"] for h in hist] == ["rollback:1", "put", "init"]
        assert hist[1]["actor"] == "ops" and hist[1]["diff"] == [{"path": "exploration_rate", "old": 0.05, "new": 0.2}]
        assert all(isinstance(h["time"], float) for h in hist)


async def test_pin_overrides_at_once_and_drain(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
    ) as c:
        doc, etag = await _policy(c)
        r = await _put(c, {**doc, "pins": {"code": "mtp"}}, etag)
        assert r.status_code == 200
        r = await c.post("/v1/chat/completions", json=CODE_REQ)
        assert (r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]) == ("mtp", "pin")
        assert r.headers["x-specroute-policy-version"] == "2"
        doc, etag = await _policy(c)
        r = await _put(c, {**doc, "pins": {}, "drained": ["dfly"]}, etag)
        r = await c.post("/v1/chat/completions", json=CODE_REQ)
        assert (r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]) == ("mtp", "fallback")


async def test_a_pull_read_before_a_write_does_not_undo_it(redis_url: str) -> None:
    """A refresh whose pull read Redis before this gateway wrote a policy (or a shadow) resumes after the
    write: it must keep the written one, not put back what it read."""
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
    ) as c:
        sync = c.app.state.gateway.sync  # type: ignore[attr-defined]
        pull, read, release = sync.store.pull, asyncio.Event(), asyncio.Event()

        async def held_pull():   # the real pull, answered only once the write below is done
            policy = await pull()
            read.set()
            await release.wait()
            return policy

        sync.store.pull = held_pull
        refresh = asyncio.create_task(sync.refresh())
        await read.wait()
        doc, etag = await _policy(c)
        assert (await _put(c, {**doc, "pins": {"code": "mtp"}}, etag)).status_code == 200
        written = sync.snapshot.policy.version
        release.set()
        await refresh
        sync.store.pull = pull
        assert sync.snapshot.policy.version == written and sync.snapshot.policy.pins == {"code": "mtp"}
        r = await c.post("/v1/chat/completions", json=CODE_REQ)
        assert (r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]) == ("mtp", "pin")


async def test_live_policy_reaches_second_gateway_within_a_second(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es:
        pools = {"mtp": [es[0].address], "dfly": [es[1].address]}
        # gateway B refreshes its stats slowly: the change must arrive by pub/sub push
        async with running_app(settings_for(pools, redis_url)) as a, running_app(
            settings_for(pools, redis_url, stats_interval_s=30.0)
        ) as b:
            doc, etag = await _policy(a)
            t0 = time.perf_counter()
            assert (await _put(a, {**doc, "pins": {"code": "mtp"}}, etag)).status_code == 200
            gw_b = b.app.state.gateway  # type: ignore[attr-defined]
            while gw_b.snapshot.policy.version < 2 and time.perf_counter() - t0 < 5:
                await asyncio.sleep(0.005)
            elapsed = time.perf_counter() - t0
            assert gw_b.snapshot.policy.version == 2 and elapsed < 1.0, elapsed
            r = await b.post("/v1/chat/completions", json=CODE_REQ)
            assert r.headers["x-specroute-reason"] == "pin"


async def test_learning_moves_code_traffic_off_a_bad_drafter(redis_url: str) -> None:
    """The dfly pool serves a mismatched drafter for code (acceptance 0.05): after a bounded number of
    requests the code traffic goes to mtp (acceptance 0.7), and a pin puts it back at once."""
    bad = FakeConfig(name="dfly", engine="dfly", acceptance={"code": 0.05}, redis_url=redis_url)
    good = FakeConfig(name="mtp", engine="mtp", acceptance={"code": 0.7}, redis_url=redis_url)
    async with engines(good, bad) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, stats_interval_s=0.05)
    ) as c:
        doc, etag = await _policy(c)
        learning = {**doc["learning"], "min_samples": 3}
        assert (await _put(c, {**doc, "exploration_rate": 0.2, "learning": learning}, etag)).status_code == 200
        pools = []
        for _ in range(80):
            r = await c.post("/v1/chat/completions", json=CODE_REQ)
            assert r.status_code == 200
            pools.append((r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]))
            await asyncio.sleep(0.02)  # let the feedback reach the snapshot
        first_learned = next(i for i, (_, why) in enumerate(pools) if why == "learned")
        tail = pools[-20:]
        share_mtp = sum(p == "mtp" for p, _ in tail) / len(tail)
        print(f"routing shift: first 'learned' decision at request {first_learned}; "
              f"mtp share of the last 20 code requests {share_mtp:.2f}")
        assert first_learned <= 40
        assert share_mtp >= 0.75
        stats = (await c.get("/admin/stats", headers=ADMIN)).json()
        cells = {(x["domain"], x["pool"]): x for x in stats["cells"]}
        assert cells[("code", "dfly")]["acceptance_rate"] < 0.1 < 0.6 < cells[("code", "mtp")]["acceptance_rate"]
        # the operator pin overrides learning at once
        doc, etag = await _policy(c)
        assert (await _put(c, {**doc, "pins": {"code": "dfly"}}, etag)).status_code == 200
        for _ in range(5):
            r = await c.post("/v1/chat/completions", json=CODE_REQ)
            assert (r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]) == ("dfly", "pin")


async def test_redis_outage_keeps_serving_and_recovers() -> None:
    srv = RedisServer().start()
    try:
        async with engines(FakeConfig(), FakeConfig()) as es, running_app(
            settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, srv.url, stats_interval_s=0.05)
        ) as c:
            doc, etag = await _policy(c)
            assert (await _put(c, {**doc, "pins": {"code": "mtp"}}, etag)).status_code == 200
            gw = c.app.state.gateway  # type: ignore[attr-defined]
            srv.stop()
            await asyncio.sleep(0.4)
            for _ in range(5):
                r = await c.post("/v1/chat/completions", json=CODE_REQ)
                assert r.status_code == 200 and r.headers["x-specroute-reason"] == "pin"  # last snapshot
            ready = await c.get("/readyz")
            assert ready.status_code == 200 and ready.json()["redis_ok"] is False
            m = (await c.get("/metrics")).text
            errors = float(next(x for x in m.splitlines() if x.startswith("specroute_redis_errors_total ")).split()[1])
            assert errors >= 1
            r = await _put(c, doc, '"2"')
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
            srv.start()  # same port, empty data: the gateway re-seeds the policy it was using
            t0 = time.perf_counter()
            while not gw.redis_ok and time.perf_counter() - t0 < 10:
                await asyncio.sleep(0.05)
            assert gw.redis_ok
            doc2, _ = await _policy(c)
            assert doc2["pins"] == {"code": "mtp"}
            r = await c.post("/v1/chat/completions", json=CODE_REQ)
            assert r.status_code == 200 and r.headers["x-specroute-reason"] == "pin"
    finally:
        srv.stop()
