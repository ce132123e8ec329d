"""The one statistics layout (global cell, domain and context level cells, the level index) written by
the one Lua script, against a real redis-server, checked with the pure Python reference; and the
migration of the retired per-domain hashes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import redis

from router.state.stats import pull_cells
from specroute.contracts.context import GLOBAL_LEVEL
from specroute.contracts.feedback import (
    CONTEXT_INDEX,
    FEEDBACK_STREAM,
    POLICY_KEY,
    CellStats,
    FeedbackRecord,
    decay_update,
    make_recorder,
    migrate_v1,
    record_cells,
    stats_key,
)
from tests.redis_server import RedisServer

CTX = "d=code|s=latin|t=high|l=short"


@pytest.fixture(scope="module")
def redis_srv() -> Iterator[RedisServer]:
    with RedisServer() as r:
        yield r


@pytest.fixture
def client(redis_srv: RedisServer) -> redis.Redis:
    c = redis.Redis.from_url(redis_srv.url)
    c.flushall()
    return c


def rec(context: str = CTX, domain: str = "code", pool: str = "dfly", tokens: int = 10, accepted: int = 8) -> FeedbackRecord:
    return FeedbackRecord(pool=pool, domain=domain, tokens=tokens, drafted=16, accepted=accepted, steps=4,
                          wall_ms=50.0, ttft_ms=10.0, request_id="r1", engine="dfly", context=context)


def cell(c: redis.Redis, key: str) -> CellStats:
    return CellStats.from_hash(c.hgetall(key))


def test_one_record_updates_every_level_atomically(client: redis.Redis) -> None:
    client.set(POLICY_KEY, json.dumps({"half_life_s": 0.5}))
    record = make_recorder(client)
    t1 = float(record(rec()))
    keys = [stats_key(GLOBAL_LEVEL, "dfly"), stats_key("code", "dfly"), stats_key(CTX, "dfly"),
            stats_key("d=code|t=high", "dfly")]
    assert record_cells(rec()) == keys
    first = decay_update(CellStats(), rec(), t1, 0.5)
    for k in keys:
        assert cell(client, k) == first, k
    # a record of another context of the same domain and pool: the shared levels decay and add,
    # the other context's cells start fresh
    other = rec(context="d=code|s=cjk|t=0|l=long", tokens=20, accepted=2)
    time.sleep(0.3)
    t2 = float(record(other))
    for k in keys[:2]:
        want = decay_update(first, other, t2, 0.5)
        got = cell(client, k)
        for f in ("n", "tokens", "drafted", "accepted", "steps", "decode_ms", "t"):
            assert getattr(got, f) == pytest.approx(getattr(want, f), rel=1e-9), (k, f)
    assert cell(client, keys[2]) == first  # untouched
    assert cell(client, stats_key("d=code|s=cjk|t=0|l=long", "dfly")) == decay_update(
        CellStats(), other, t2, 0.5)
    assert cell(client, stats_key("d=code|t=0", "dfly")).n == 1.0
    # the index names the domain and the four context cells, newest first; only the global cell lasts
    members = [m.decode() for m in client.zrevrange(CONTEXT_INDEX, 0, -1)]
    assert set(members[:3]) == {"code:dfly", "d=code|s=cjk|t=0|l=long:dfly", "d=code|t=0:dfly"}
    assert set(members[3:]) == {f"{CTX}:dfly", "d=code|t=high:dfly"}
    assert 0 < client.ttl(keys[2]) <= 3600 and 0 < client.ttl(keys[1]) <= 3600 and client.ttl(keys[0]) == -1
    entries = client.xrange(FEEDBACK_STREAM)
    assert [e[1][b"context"] for e in entries] == [CTX.encode(), b"d=code|s=cjk|t=0|l=long"]


def test_a_constrained_records_acceptance_is_kept_apart(client: redis.Redis) -> None:
    """A record under a JSON schema or tools updates its own context cells (`c=json`, `c=tools`), never the
    unconstrained ones, which keep the keys of before the constraint existed; domain and global add up all."""
    record = make_recorder(client)
    record(rec(context="d=code|s=latin|t=0|l=short"))
    record(rec(context="d=code|s=latin|t=0|l=short|c=json", accepted=1))
    record(rec(context="d=code|s=latin|t=0|l=short|c=tools", accepted=2))
    for level, accepted in (("d=code|s=latin|t=0|l=short", 8), ("d=code|t=0", 8), ("d=code|t=0|c=json", 1),
                            ("d=code|s=latin|t=0|l=short|c=json", 1), ("d=code|t=0|c=tools", 2)):
        got = cell(client, stats_key(level, "dfly"))
        assert (got.n, got.accepted) == pytest.approx((1.0, accepted), rel=1e-3), level   # decayed a few ms
    for level in ("code", GLOBAL_LEVEL):
        assert cell(client, stats_key(level, "dfly")).n == pytest.approx(3.0, rel=1e-3)
    assert [e[1][b"context"] for e in client.xrange(FEEDBACK_STREAM)][1] == b"d=code|s=latin|t=0|l=short|c=json"


@pytest.mark.parametrize("context", ["", "garbage", "d=math|s=latin|t=0|l=short", "d=code|s=latin|t=9|l=short"])
def test_missing_or_untrusted_context_updates_domain_and_global_only(client: redis.Redis, context: str) -> None:
    make_recorder(client)(rec(context=context))
    assert cell(client, stats_key("code", "dfly")).n == 1.0
    assert cell(client, stats_key(GLOBAL_LEVEL, "dfly")).n == 1.0
    assert [m.decode() for m in client.zrange(CONTEXT_INDEX, 0, -1)] == ["code:dfly"]
    assert sorted(k.decode() for k in client.keys("{specroute}:stats:*") if k != CONTEXT_INDEX.encode()) == sorted(
        [stats_key("code", "dfly"), stats_key(GLOBAL_LEVEL, "dfly")])


def test_context_ttl_follows_the_half_life(client: redis.Redis) -> None:
    client.set(POLICY_KEY, json.dumps({"half_life_s": 1000.0}))
    make_recorder(client)(rec())
    assert 19_000 < client.ttl(stats_key(CTX, "dfly")) <= 20_000  # 20 half-lives


def test_index_is_capped_to_the_most_recent_cells(client: redis.Redis) -> None:
    from specroute.contracts.feedback import UPDATE_STATS_LUA, script_args

    script = client.register_script(UPDATE_STATS_LUA)
    scripts = ("latin", "cjk", "cyrillic", "arabic", "other")
    for s in scripts:
        keys, argv = script_args(rec(context=f"d=code|s={s}|t=0|l=short"), index_cap=3)
        script(keys=keys, args=argv)
        assert client.zcard(CONTEXT_INDEX) == 3  # domain, full and coarse cell, then the cap
    members = {m.decode() for m in client.zrange(CONTEXT_INDEX, 0, -1)}
    assert members == {"code:dfly", "d=code|s=other|t=0|l=short:dfly", "d=code|t=0:dfly"}
    assert "d=code|s=latin|t=0|l=short:dfly" not in members


def test_gateway_pull_reads_global_and_recent_context_cells(redis_srv: RedisServer, client: redis.Redis) -> None:
    record = make_recorder(client)
    record(rec())
    record(rec(pool="mtp"))
    record(rec(pool="gone"))  # a pool this gateway does not route to is not pulled

    async def pull() -> tuple[float, dict[tuple[str, str], CellStats]]:
        import redis.asyncio as aredis

        ac = aredis.Redis.from_url(redis_srv.url)
        try:
            return await pull_cells(ac, ["dfly", "mtp", "ar"])
        finally:
            await ac.aclose()

    now, cells = asyncio.run(pull())
    assert abs(now - time.time()) < 60
    assert set(cells) == {(lvl, p) for p in ("dfly", "mtp") for lvl in (GLOBAL_LEVEL, "code", CTX, "d=code|t=high")}
    assert all(c.n == 1.0 for c in cells.values())


def test_retired_per_domain_cells_move_into_the_one_schema(redis_srv: RedisServer, client: redis.Redis) -> None:
    old = {"n": "3", "tokens": "30", "drafted": "12", "accepted": "6", "steps": "6", "decode_ms": "60",
           "ttft_ms": "9", "wall_ms": "69", "t": "1700000000.5"}
    client.hset("{specroute}:stats:math:mtp", mapping=old)
    client.hset("{specroute}:stats:bad name:mtp", mapping=old)   # not a domain name: becomes `unknown`
    make_recorder(client)(rec(context=""))                     # a live domain cell is kept as it is

    client.hset("{specroute}:stats:code:dfly", mapping=old)

    async def migrate() -> int:
        import redis.asyncio as aredis

        ac = aredis.Redis.from_url(redis_srv.url)
        try:
            return await migrate_v1(ac)
        finally:
            await ac.aclose()

    assert asyncio.run(migrate()) == 2
    assert asyncio.run(migrate()) == 0   # idempotent
    assert cell(client, stats_key("math", "mtp")) == CellStats.from_hash(old)
    assert cell(client, stats_key("unknown", "mtp")).n == 3.0
    assert cell(client, stats_key("code", "dfly")).n == 1.0
    assert not [k for k in client.keys("{specroute}:stats:*") if not k.startswith(b"{specroute}:stats:v2:")]
    assert {"math:mtp", "unknown:mtp"} <= {m.decode() for m in client.zrange(CONTEXT_INDEX, 0, -1)}
