"""The decayed-aggregate Lua script against a real redis-server, checked with the Python reference."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis

from specroute.contracts.feedback import (
    FEEDBACK_STREAM,
    POLICY_KEY,
    CellStats,
    FeedbackRecord,
    decay_update,
    make_recorder,
    stats_key,
)
from tests.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_srv() -> Iterator[RedisServer]:
    with RedisServer() as r:
        yield r


def rec(tokens: int = 10, drafted: int = 16, accepted: int = 8, steps: int = 4) -> FeedbackRecord:
    return FeedbackRecord(
        pool="dfly", domain="code", tokens=tokens, drafted=drafted, accepted=accepted, steps=steps,
        wall_ms=50.0, ttft_ms=10.0, request_id="r1", engine="dfly",
    )


def test_lua_matches_reference_and_decays(redis_srv: RedisServer) -> None:
    c = redis.Redis.from_url(redis_srv.url)
    c.flushall()
    c.set(POLICY_KEY, json.dumps({"half_life_s": 0.5}))
    record = make_recorder(c)
    t1 = float(record(rec()))
    s1 = CellStats.from_hash(c.hgetall(stats_key("code", "dfly")))
    assert s1 == decay_update(CellStats(), rec(), t1, 0.5)
    assert s1.acceptance_rate == 0.5 and s1.mean_accepted_length == 3.0 and s1.step_ms == 10.0
    import time

    time.sleep(0.5)
    t2 = float(record(rec(tokens=20)))
    s2 = CellStats.from_hash(c.hgetall(stats_key("code", "dfly")))
    ref = decay_update(s1, rec(tokens=20), t2, 0.5)
    for k in ("n", "tokens", "drafted", "accepted", "steps", "decode_ms"):
        assert getattr(s2, k) == pytest.approx(getattr(ref, k), rel=1e-9)
    assert 1.4 < s2.n < 1.6  # one half-life later: 1 * 0.5 + 1
    entries = c.xrange(FEEDBACK_STREAM)
    assert len(entries) == 2 and entries[0][1][b"pool"] == b"dfly" and entries[0][1][b"accepted"] == b"8"


def test_default_half_life_without_policy(redis_srv: RedisServer) -> None:
    c = redis.Redis.from_url(redis_srv.url)
    c.flushall()
    record = make_recorder(c, default_half_life_s=1e9)
    for _ in range(3):
        record(rec())
    s = CellStats.from_hash(c.hgetall(stats_key("code", "dfly")))
    assert s.n == pytest.approx(3.0, rel=1e-6)


def test_decayed_to_preserves_ratios() -> None:
    s = CellStats(n=4, tokens=40, drafted=32, accepted=16, steps=8, decode_ms=80, t=10.0)
    d = s.decayed_to(20.0, 10.0)
    assert d.n == pytest.approx(2.0) and d.acceptance_rate == s.acceptance_rate and d.step_ms == s.step_ms
    assert CellStats.from_hash({b"n": b"x", b"tokens": b"3", "bogus": "1"}) == CellStats(tokens=3.0)


@pytest.mark.asyncio(loop_scope="session")  # grpc.aio in the router tests: one loop per session
async def test_async_recorder(redis_srv: RedisServer) -> None:
    c = aredis.Redis.from_url(redis_srv.url)
    try:
        await c.flushall()
        record = make_recorder(c)
        await record(rec())
        raw = await c.hgetall(stats_key("code", "dfly"))
        assert CellStats.from_hash(raw).n == 1.0
    finally:
        await c.aclose()
