"""Conversation affinity: the pure rule (router/routing/conversation.py), and a gateway (fake engine
workers, real Redis) keeping each conversation's turns on one worker while switching gains less than
the prefill of its history (router/state/conversations.py, router/api/turns.py). 5-10 s on two loaded
cores."""

from __future__ import annotations

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from router.routing.conversation import (
    Sticky,
    conversation_key,
    messages_key,
    stick,
    sticky_decision,
    turn_key,
)
from router.routing.decide import Decision
from router.state.conversations import Conversations
from tests.redis_server import free_port
from tests.router.conftest import ADMIN, engines, running_app, settings_for, snapshot_holds
from tests.router.fake_engine import FakeConfig

SYS = ("system", "be brief")


def test_keys_header_then_user_then_prior_messages() -> None:
    msgs = [SYS, ("user", "hi"), ("assistant", "hello"), ("user", "more")]
    assert conversation_key("c1", "u1", msgs)[0] == "header"
    assert conversation_key(None, "u1", msgs)[0] == "user"
    assert conversation_key("c1", None, None) != conversation_key("c2", None, None)
    # one API key's ids are not another's
    assert conversation_key("c1", None, None, "team-a") != conversation_key("c1", None, None, "team-b")
    source, key = conversation_key(None, None, msgs)  # type: ignore[misc]
    assert source == "prefix" and key == messages_key(msgs[:-1])
    # the first turn has no assistant message: no conversation yet (a shared system prompt is not one)
    assert conversation_key(None, None, [SYS, ("user", "hi")]) is None
    # what a served turn records is what the next turn's prior messages hash to
    assert turn_key([SYS, ("user", "hi")], "hello") == key
    assert turn_key([SYS, ("user", "hi")], "hello!") != key


def test_stick_weighs_the_gain_of_switching_against_the_prefill_of_the_history() -> None:
    fresh = Decision("dfly", "code", "learned", {"mtp": 11.0, "dfly": 19.0})  # Thompson draws
    sticky = Sticky("mtp", "10.0.0.1:1")
    pools = ["mtp", "dfly"]
    mean = {"mtp": 10.0, "dfly": 20.0}   # the expected goodput, at the posterior mean
    # 100 tokens at 10 vs 20 tok/s: switching saves 5000 ms; 1000 history tokens at 1 ms cost 1000 ms
    v = stick(fresh, sticky, 1000, 100, mean, {"dfly": 1.0}, 9.0, pools)
    assert (v.stay, v.why, v.gain_ms, v.cost_ms) == (False, "gain", 5000.0, 1000.0)
    # a long history costs more to prefill elsewhere than switching gains: stay
    v = stick(fresh, sticky, 10_000, 100, mean, {"dfly": 1.0}, 9.0, pools)
    assert v.stay and v.why == "stay" and v.cost_ms == 10_000.0
    assert sticky_decision(fresh, sticky) == Decision("mtp", "code", "conversation", fresh.scores)
    # an unobserved pool's prefill cost is the default
    assert stick(fresh, sticky, 1000, 100, mean, {}, 9.0, pools).stay
    # no estimate for either pool: no evidence of a gain, so stay
    assert stick(Decision("dfly", "code", "default"), sticky, 1, 100, {"dfly": 20.0}, {}, 1.0, pools).stay
    # a pin, or a sticky pool that cannot serve, moves the conversation
    assert stick(Decision("dfly", "code", "pin"), sticky, 10_000, 100, mean, {}, 1.0, pools).why == "pin"
    assert stick(fresh, sticky, 10_000, 100, mean, {}, 1.0, ["dfly"]).why == "unavailable"
    assert stick(Decision("mtp", "code", "default"), sticky, 0, 100, mean, {}, 1.0, pools).why == "same_pool"


async def test_turns_stay_on_their_worker(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig(), FakeConfig()) as es:
        s = settings_for({"mtp": [es[0].address, es[1].address], "dfly": [es[2].address]}, redis_url)
        async with running_app(s) as client:
            r = await client.get("/admin/policy", headers=ADMIN)
            doc = {**r.json(), "exploration_rate": 0.0}
            assert (await client.put("/admin/policy", json=doc, headers={**ADMIN, "if-match": r.headers["etag"]})
                    ).status_code == 200

            async def turn(messages: list[dict[str, str]], h: dict[str, str] | None = None) -> tuple[str, str, str]:
                r = await client.post("/v1/chat/completions", json={"model": "fake-model", "messages": messages,
                                                                     "max_tokens": 4}, headers=h or {})
                assert r.status_code == 200, r.text
                await client.app.state.gateway.conversations.flush()  # type: ignore[attr-defined]
                return (r.headers["x-specroute-worker"], r.headers.get("x-specroute-conversation", ""),
                        r.json()["choices"][0]["message"]["content"])

            for n in range(3):  # three conversations identified by their history, three turns each
                msgs = [{"role": "user", "content": f"hello number {n}"}]
                workers = []
                for t in range(3):
                    w, how, answer = await turn(msgs)
                    workers.append(w)
                    assert how == ("" if t == 0 else "stay")
                    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"and {t}"}]
                assert len(set(workers)) == 1, workers
            # by header: the same id keeps its worker whatever the messages
            first, how, _ = await turn([{"role": "user", "content": "a"}], h={"x-conversation-id": "conv-7"})
            assert how == "new"
            for text in ("b", "c", "d"):
                w, how, _ = await turn([{"role": "user", "content": text}], h={"x-conversation-id": "conv-7"})
                assert (w, how) == (first, "stay")
            # the state is in Redis, with a TTL
            keys = redis.Redis.from_url(redis_url).keys("{specroute}:conv:*")
            assert keys and 0 < redis.Redis.from_url(redis_url).ttl(keys[0]) <= 1800
            metrics = (await client.get("/metrics")).text
            assert 'specroute_conversation_routes_total{outcome="same_pool",pool="mtp"}' in metrics


async def test_a_conversation_moves_when_the_gain_beats_the_prefill(redis_url: str) -> None:
    """Code traffic: mtp accepts 0.9 of its drafts, dfly 0.05 (10 ms steps: expected 492 against 137
    tokens/s). Conversations begun on dfly by a pin; then learning prefers mtp. A turn asking for 2 tokens
    gains 10.5 ms by moving, less than prefilling 25 tokens of history at 1 ms: it stays. One asking
    for 100 gains 527 ms: it moves."""
    good = FakeConfig(name="mtp", engine="mtp", acceptance={"code": 0.9}, redis_url=redis_url)
    bad = FakeConfig(name="dfly", engine="dfly", acceptance={"code": 0.05}, redis_url=redis_url)
    async with engines(good, bad) as es, running_app(
            settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, stats_interval_s=0.05)) as c:
        g = c.app.state.gateway  # type: ignore[attr-defined]
        g.conversations.prefill.ms_per_token = {"mtp": 1.0, "dfly": 1.0}
        g.conversations.prefill.alpha = 0.0   # hold the prefill cost at 1 ms a token

        async def policy(**change: object) -> None:
            r = await c.get("/admin/policy", headers=ADMIN)
            doc = {**r.json(), **change}
            assert (await c.put("/admin/policy", json=doc, headers={**ADMIN, "if-match": r.headers["etag"]})
                    ).status_code == 200

        async def turn(conv: str, user: str, max_tokens: int) -> dict[str, str]:
            msgs = [{"role": "user", "content": "write python code " + "x" * 80}, {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": user}]
            r = await c.post("/v1/chat/completions", json={"model": "fake-model", "messages": msgs, "max_tokens": max_tokens},
                             headers={"x-conversation-id": conv})
            assert r.status_code == 200, r.text
            await g.conversations.flush()
            return dict(r.headers)

        for pool in ("mtp", "dfly"):  # evidence on both pools
            await policy(pins={"code": pool})
            for _ in range(3):
                await turn("warm-up-" + pool, "write python code", 4)
        await policy(pins={"code": "dfly"})
        for conv in ("c-stay", "c-move"):
            assert (await turn(conv, "write python code", 4))["x-specroute-pool"] == "dfly"
        learning = {**(await c.get("/admin/policy", headers=ADMIN)).json()["learning"], "min_samples": 1.0,
                    "switch_margin": 0.0}
        await policy(pins={}, exploration_rate=0.0, learning=learning)
        await snapshot_holds(g, {"mtp": 3, "dfly": 5})
        h = await turn("c-stay", "and more python code", 2)
        assert (h["x-specroute-conversation"], h["x-specroute-pool"], h["x-specroute-reason"]) == \
            ("stay", "dfly", "conversation")
        h = await turn("c-move", "and more python code", 100)
        assert (h["x-specroute-conversation"], h["x-specroute-pool"], h["x-specroute-reason"]) == \
            ("switch", "mtp", "learned")
        metrics = (await c.get("/metrics")).text
        assert 'specroute_conversation_routes_total{outcome="gain",pool="dfly"} 1.0' in metrics
        assert 'specroute_conversation_routes_total{outcome="stay",pool="dfly"} 1.0' in metrics


async def test_state_without_redis_and_with_redis_down() -> None:
    local = Conversations(None, ttl_s=60)
    local.remember(["k"], Sticky("mtp", "a:1"))
    assert await local.lookup("k") == Sticky("mtp", "a:1") and await local.lookup("other") is None
    errors: list[BaseException] = []
    down = Conversations(aredis.Redis(port=free_port(), socket_timeout=0.2, socket_connect_timeout=0.2,
                                      retry=Retry(NoBackoff(), 0)),
                         ttl_s=60, on_error=errors.append)
    try:
        assert await down.lookup("k") is None   # no affinity, no error to the client
        down.remember(["k"], Sticky("mtp", "a:1"))
        await down.flush()
        assert len(errors) == 2
    finally:
        await down.client.aclose()  # type: ignore[union-attr]


async def test_a_gateway_reads_its_own_unwritten_turns(redis_url: str) -> None:
    """A turn's record is written in the background; the next turn, arriving before that write lands,
    still finds it (from the gateway's memory), and after the write Redis answers."""
    client = aredis.Redis.from_url(redis_url)
    conv = Conversations(client, ttl_s=60)
    try:
        conv.remember(["early"], Sticky("dfly", "b:2"))
        assert await conv.lookup("early") == Sticky("dfly", "b:2")   # the writer has not run yet
        await conv.flush()
        assert not conv._unwritten
        assert await conv.lookup("early") == Sticky("dfly", "b:2")   # now from Redis
        assert await client.get("{specroute}:conv:early") is not None
    finally:
        await client.aclose()
