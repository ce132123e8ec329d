"""The gateway's and the workers' Redis state on a real 3-node Redis Cluster (tests/redis_cluster.py),
reached with one URL, `redis+cluster://host:port`: the rate limiter refuses past its limit (never fails
open), feedback and statistics writes all land and are read back, the policy store's compare-and-set,
history and pub/sub push work across gateways, the API-key store and its audit log are shared, the
time series is written; and the names from before the `{specroute}` hash tag are moved, once, on one
Redis and on a cluster. Costs about 10 s (the cluster starts once for the module, in about 4 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import redis
import redis.cluster

from router.routing.policy import default_policy
from router.state.stats import pull_cells
from router.state.store import EVENTS_CHANNEL, PolicyStore, VersionConflict
from specroute.contracts.feedback import (
    CONTEXT_INDEX,
    FEEDBACK_STREAM,
    LEGACY_PREFIX,
    POLICY_KEY,
    PREFIX,
    build_record,
)
from specroute.feedback_writer import FeedbackWriter
from specroute.redis_url import connect, connect_sync, is_cluster, migrate_legacy_names, node_url
from tests.redis_cluster import RedisCluster
from tests.redis_server import RedisServer
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

ASYNC = pytest.mark.asyncio(loop_scope="session")
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
KEY = "sk-team-0123456789abcdef"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as c:
        yield c


@pytest.fixture
def cluster_url(cluster: RedisCluster) -> str:
    connect_sync(cluster.url).flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    return cluster.url


def test_url_scheme_picks_the_cluster_client() -> None:
    assert is_cluster("redis+cluster://10.0.0.1:7000") and is_cluster("rediss+cluster://u:p@h:1")
    assert not is_cluster("redis://127.0.0.1:6379/0")
    assert node_url("redis+cluster://:pw@h:7000/0") == "redis://:pw@h:7000"
    assert node_url("redis://h:1/2") == "redis://h:1/2"
    assert type(connect("redis+cluster://127.0.0.1:1")).__name__ == "RedisCluster"
    assert type(connect("redis://127.0.0.1:1/0")).__name__ == "Redis"


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


@ASYNC
async def test_gateway_on_a_cluster_limits_records_and_shares_policy_and_keys(cluster_url: str) -> None:
    sync = connect_sync(cluster_url)
    cfg = FakeConfig(name="mtp", engine="mtp", redis_url=cluster_url)   # the worker's feedback goes to the cluster
    async with engines(cfg) as es:
        s = settings_for({"mtp": [es[0].address]}, cluster_url, api_keys=f"team:{KEY}",
                         api_key_limits='{"team": {"rpm": 3}}', timeseries_interval_s=0.2,
                         health_timeout_s=5.0, redis_timeout_s=3.0)   # a loaded machine: no spurious timeout
        async with running_app(s) as a, running_app(s) as b:
            auth = {"authorization": f"Bearer {KEY}"}
            # the rate limiter counts across both gateways in the cluster: 3 admitted, then refused
            codes = [(await (a if i % 2 else b).post("/v1/chat/completions", json=CHAT, headers=auth)).status_code
                     for i in range(5)]
            assert codes == [200, 200, 200, 429, 429]
            # the policy store: compare-and-set, history, and the push to the other gateway
            r = await a.get("/admin/policy", headers=ADMIN)
            doc, etag = r.json(), r.headers["etag"]
            assert (await a.put("/admin/policy", json={**doc, "pins": {"code": "mtp"}},
                                headers={**ADMIN, "if-match": etag})).status_code == 200
            assert (await a.put("/admin/policy", json=doc, headers={**ADMIN, "if-match": etag})).status_code == 412
            gw_b = b.app.state.gateway  # type: ignore[attr-defined]
            t0 = time.monotonic()
            while gw_b.snapshot.policy.version < 2 and time.monotonic() - t0 < 5:
                await asyncio.sleep(0.01)
            assert gw_b.snapshot.policy.version == 2
            versions = (await b.get("/admin/policy/versions", headers=ADMIN)).json()["versions"]
            assert [v["version"] for v in versions] == [2, 1]
            # the key store: a key written on one gateway serves on the other; the audit log has it
            secret = "sk-new-key-0123456789"
            assert (await a.put("/admin/keys/x", json={"secret": secret, "rpm": 100},
                                headers=ADMIN)).status_code == 200
            t0 = time.monotonic()
            while (await b.post("/v1/chat/completions", json=CHAT,
                                headers={"authorization": f"Bearer {secret}"})).status_code != 200:
                assert time.monotonic() - t0 < 5
                await asyncio.sleep(0.05)
            audit = (await b.get("/admin/audit", headers=ADMIN)).json()["entries"]
            assert [(e["action"], e["key"]) for e in audit] == [("key:put", "x")]
            await asyncio.sleep(0.5)   # a time-series sample, the worker's last feedback record
            series = await b.get("/admin/timeseries?window=60", headers=ADMIN)
            assert series.status_code == 200, series.text
            for c in (a, b):
                m = (await c.get("/metrics")).text
                assert _metric(m, "specroute_redis_errors_total") == 0
                assert _metric(m, "specroute_rate_limit_fail_open_total") == 0
            assert sync.xlen(FEEDBACK_STREAM) >= 4   # the 3 admitted requests and the new key's first
            assert sync.zcard(CONTEXT_INDEX) >= 1
            assert sync.exists(PREFIX + "ts")
    # every shared key sits in the one slot of the hash tag
    slots = {sync.keyslot(k) for k in sync.scan_iter(match=PREFIX + "*")}
    assert slots == {sync.keyslot(POLICY_KEY)}


@ASYNC
async def test_feedback_writes_are_all_recorded_and_read_back(cluster_url: str) -> None:
    n = 60
    writer = FeedbackWriter.from_url(cluster_url)
    writer.start()
    for i in range(n):
        pool = ("mtp", "dfly")[i % 2]
        writer.put(build_record(request_id=f"r{i}", pool=pool, domain="code", context="d=code|s=latin|t=0|l=short",
                                engine=pool, tokens=10, counts=(8, 6, 2), wall_s=0.05, ttft_s=0.01))
    t0 = time.monotonic()
    while writer.written + writer.errors < n and time.monotonic() - t0 < 10:
        await asyncio.sleep(0.02)
    await writer.close()
    assert (writer.written, writer.errors) == (n, 0)
    client = connect(cluster_url)
    try:
        _, cells = await pull_cells(client, ["mtp", "dfly"])
    finally:
        await client.aclose()
    for pool in ("mtp", "dfly"):
        assert cells[("*", pool)].n == pytest.approx(n / 2, rel=0.01)   # no loss (decay over a second is ~0.2%)
        assert cells[("code", pool)].n == pytest.approx(n / 2, rel=0.01)
        assert cells[("d=code|s=latin|t=0|l=short", pool)].n == pytest.approx(n / 2, rel=0.01)
    assert connect_sync(cluster_url).xlen(FEEDBACK_STREAM) == n


LEGACY = {"policy": "string", "policy:versions": "list", "keys": "hash", "audit": "list", "ts": "zset",
          "stats:v2:all:mtp": "hash", "stats:code:mtp": "hash"}


def _write_legacy(r: redis.Redis) -> None:
    p = LEGACY_PREFIX
    r.set(p + "policy", b'{"version": 7}')
    r.rpush(p + "policy:versions", b'{"version": 7}')
    r.hset(p + "keys", "team", b'{"rpm": 5}')
    r.rpush(p + "audit", b"a", b"b")
    r.zadd(p + "ts", {b"s": 1.0})
    r.hset(p + "stats:v2:all:mtp", mapping={"n": 3, "t": 1.0})
    r.expire(p + "stats:v2:all:mtp", 3600)
    r.hset(p + "stats:code:mtp", mapping={"n": 2, "t": 1.0})   # the retired v1 layout: migrate_v1's
    r.hset(p + "rl:{team}", "r:1", 1)   # the rate limiter's: keeps its name


def _check_moved(r: redis.Redis) -> None:
    assert r.get(POLICY_KEY) == b'{"version": 7}'
    assert r.lrange(PREFIX + "audit", 0, -1) == [b"a", b"b"]
    assert r.hget(PREFIX + "keys", "team") == b'{"rpm": 5}'
    assert r.zscore(PREFIX + "ts", b"s") == 1.0
    assert r.hget(PREFIX + "stats:code:mtp", "n") == b"2"
    assert 0 < r.ttl(PREFIX + "stats:v2:all:mtp") <= 3600   # its TTL moves with it
    left = sorted(k.decode() for k in r.scan_iter(match=LEGACY_PREFIX + "*"))
    assert left == [LEGACY_PREFIX + "rl:{team}"]


@ASYNC
@pytest.mark.parametrize("kind", ["single", "cluster"])
async def test_legacy_names_move_to_the_hash_tag_once(kind: str, cluster_url: str) -> None:
    with RedisServer() as single:
        url = single.url if kind == "single" else cluster_url
        sync = connect_sync(url)
        _write_legacy(sync)
        client = connect(url)
        try:
            moved, kept = await migrate_legacy_names(client)
            assert (moved, kept) == (7, [])
            _check_moved(sync)
            assert await migrate_legacy_names(client) == (0, [])   # idempotent
            sync.set(LEGACY_PREFIX + "policy", b'{"version": 1}')   # an old gateway wrote meanwhile
            assert await migrate_legacy_names(client) == (0, [LEGACY_PREFIX + "policy"])
            assert sync.get(POLICY_KEY) == b'{"version": 7}'
        finally:
            await client.aclose()


@ASYNC
async def test_a_gateway_moves_legacy_names_at_start() -> None:
    """The gateway moves the names before it reads: the stored policy (version 7) is kept, not re-seeded."""
    with RedisServer() as single:
        r = redis.Redis.from_url(single.url)
        async with engines(FakeConfig()) as es:
            s = settings_for({"mtp": [es[0].address]}, single.url)
            async with running_app(s):
                doc = json.loads(r.get(POLICY_KEY))   # a valid document of this pool set
            r.flushall()
            _write_legacy(r)
            r.set(LEGACY_PREFIX + "policy", json.dumps({**doc, "version": 7}))
            async with running_app(s) as c:
                assert c.app.state.gateway.snapshot.policy.version == 7  # type: ignore[attr-defined]
        assert r.exists(LEGACY_PREFIX + "policy") == 0 and json.loads(r.get(POLICY_KEY))["version"] == 7


@ASYNC
async def test_policy_writes_push_to_subscribers_on_a_cluster(cluster_url: str) -> None:
    """The policy's pub/sub push (what a gateway listens to) works through the cluster client."""
    store = PolicyStore(cluster_url, timeout_s=3.0)
    sub = store.pubsub_client()
    ps = sub.pubsub(ignore_subscribe_messages=True)
    try:
        await ps.subscribe(EVENTS_CHANNEL)
        first = await store.init(default_policy(["mtp", "dfly"]))
        assert first.version == 1
        got = None
        t0 = time.monotonic()
        while got is None and time.monotonic() - t0 < 5:
            msg = await ps.get_message(timeout=1.0)
            if msg and msg.get("type") == "message":
                got = json.loads(msg["data"])
        assert got is not None and got["version"] == 1
        with pytest.raises(VersionConflict):
            await store.put(first, 0, actor="test")
    finally:
        await ps.aclose()
        await sub.aclose()
        await store.close()


@ASYNC
async def test_keys_read_before_the_snapshot_migrated_keep_the_old_secret() -> None:
    """A gateway whose key store reaches Redis before its snapshot moved the legacy names (Redis down
    at start) moves them itself, so it adopts the stored key-hash secret instead of making a new one."""
    from router.keys.store import KeyManager
    from router.observability.metrics import Metrics

    with RedisServer() as single:
        r = redis.Redis.from_url(single.url)
        r.set(LEGACY_PREFIX + "keys:hash-secret", b"the-secret-the-gateways-shared")
        r.hset(LEGACY_PREFIX + "keys", "team", b'{"rpm": 5}')
        store = PolicyStore(single.url, timeout_s=3.0)
        keys = KeyManager({}, {}, store, Metrics(), interval_s=60.0)
        try:
            await keys.pull()
        finally:
            await store.client.aclose()
        assert keys.hash_key == b"the-secret-the-gateways-shared"
        assert r.exists(LEGACY_PREFIX + "keys:hash-secret") == 0
