"""The v2 statistics layout (per context and global cells, the context index) written by the one Lua
script, against a real redis-server, checked with the pure Python reference."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import redis

from router.state.stats import pull_context_cells
from specroute.contracts.context import GLOBAL_LEVEL
from specroute.contracts.feedback import (
    CONTEXT_INDEX,
    FEEDBACK_STREAM,
    POLICY_KEY,
    CellStats,
    FeedbackRecord,
    context_stats_key,
    decay_update,
    global_stats_key,
    make_recorder,
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
    keys = [stats_key("code", "dfly"), global_stats_key("dfly"), context_stats_key(CTX, "dfly"),
            context_stats_key("d=code|t=high", "dfly")]
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
    assert cell(client, context_stats_key("d=code|s=cjk|t=0|l=long", "dfly")) == decay_update(
        CellStats(), other, t2, 0.5)
    assert cell(client, context_stats_key("d=code|t=0", "dfly")).n == 1.0
    # the index names the four context cells, newest first; only context cells expire
    members = [m.decode() for m in client.zrevrange(CONTEXT_INDEX, 0, -1)]
    assert set(members[:2]) == {"d=code|s=cjk|t=0|l=long:dfly", "d=code|t=0:dfly"}
    assert set(members[2:]) == {f"{CTX}:dfly", "d=code|t=high:dfly"}
    assert 0 < client.ttl(keys[2]) <= 3600 and client.ttl(keys[0]) == -1 and client.ttl(keys[1]) == -1
    entries = client.xrange(FEEDBACK_STREAM)
    assert [e[1][b"context"] for e in entries] == [CTX.encode(), b"d=code|s=cjk|t=0|l=long"]


@pytest.mark.parametrize("context", ["", "garbage", "d=math|s=latin|t=0|l=short", "d=code|s=latin|t=9|l=short"])
def test_missing_or_untrusted_context_updates_domain_and_global_only(client: redis.Redis, context: str) -> None:
    make_recorder(client)(rec(context=context))
    assert cell(client, stats_key("code", "dfly")).n == 1.0
    assert cell(client, global_stats_key("dfly")).n == 1.0
    assert client.zcard(CONTEXT_INDEX) == 0
    assert sorted(k.decode() for k in client.keys("specroute:stats:*")) == sorted(
        [stats_key("code", "dfly"), global_stats_key("dfly")])


def test_context_ttl_follows_the_half_life(client: redis.Redis) -> None:
    client.set(POLICY_KEY, json.dumps({"half_life_s": 1000.0}))
    make_recorder(client)(rec())
    assert 19_000 < client.ttl(context_stats_key(CTX, "dfly")) <= 20_000  # 20 half-lives


def test_index_is_capped_to_the_most_recent_cells(client: redis.Redis) -> None:
    from specroute.contracts.feedback import UPDATE_STATS_LUA, script_args

    script = client.register_script(UPDATE_STATS_LUA)
    scripts = ("latin", "cjk", "cyrillic", "arabic", "other")
    for i, s in enumerate(scripts):
        keys, argv = script_args(rec(context=f"d=code|s={s}|t=0|l=short"), index_cap=3)
        script(keys=keys, args=argv)
        assert client.zcard(CONTEXT_INDEX) == (2 if i == 0 else 3)  # full + coarse cell, then the cap
    members = {m.decode() for m in client.zrange(CONTEXT_INDEX, 0, -1)}
    assert "d=code|s=other|t=0|l=short:dfly" in members and "d=code|t=0:dfly" in members
    assert "d=code|s=latin|t=0|l=short:dfly" not in members


def test_gateway_pull_reads_global_and_recent_context_cells(redis_srv: RedisServer, client: redis.Redis) -> None:
    record = make_recorder(client)
    record(rec())
    record(rec(pool="mtp"))
    record(rec(pool="gone"))  # a pool this gateway does not route to is not pulled

    async def pull() -> dict[tuple[str, str], CellStats]:
        import redis.asyncio as aredis

        ac = aredis.Redis.from_url(redis_srv.url)
        try:
            return await pull_context_cells(ac, ["dfly", "mtp", "ar"])
        finally:
            await ac.aclose()

    cells = asyncio.run(pull())
    assert set(cells) == {(GLOBAL_LEVEL, "dfly"), (GLOBAL_LEVEL, "mtp"), (CTX, "dfly"), (CTX, "mtp"),
                          ("d=code|t=high", "dfly"), ("d=code|t=high", "mtp")}
    assert all(c.n == 1.0 for c in cells.values())
