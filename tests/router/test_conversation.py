"""Conversation affinity: the pure rule (router/routing/conversation.py), and a gateway (fake engine
workers, real Redis) keeping each conversation's turns on one worker while switching gains less than
the prefill of its history (router/state/conversations.py, router/api/turns.py). About 3 s."""

from __future__ import annotations

import redis

from router.routing.conversation import (
    Sticky,
    conversation_key,
    messages_key,
    stick,
    sticky_decision,
    turn_key,
)
from router.routing.decide import Decision
from tests.router.conftest import ADMIN, engines, running_app, settings_for
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
    fresh = Decision("dfly", "code", "learned", {"mtp": 10.0, "dfly": 20.0})
    sticky = Sticky("mtp", "10.0.0.1:1")
    pools = ["mtp", "dfly"]
    # 100 tokens at 10 vs 20 tok/s: switching saves 5000 ms; 1000 history tokens at 1 ms cost 1000 ms
    v = stick(fresh, sticky, 1000, 100, {"dfly": 1.0}, 9.0, pools)
    assert (v.stay, v.why, v.gain_ms, v.cost_ms) == (False, "gain", 5000.0, 1000.0)
    # a long history costs more to prefill elsewhere than switching gains: stay
    v = stick(fresh, sticky, 10_000, 100, {"dfly": 1.0}, 9.0, pools)
    assert v.stay and v.why == "stay" and v.cost_ms == 10_000.0
    assert sticky_decision(fresh, sticky) == Decision("mtp", "code", "conversation", fresh.scores)
    # an unobserved pool's prefill cost is the default
    assert stick(fresh, sticky, 1000, 100, {}, 9.0, pools).stay
    # no score for either pool: no evidence of a gain, so stay
    assert stick(Decision("dfly", "code", "default"), sticky, 1, 100, {}, 1.0, pools).stay
    # a pin, or a sticky pool that cannot serve, moves the conversation
    assert stick(Decision("dfly", "code", "pin"), sticky, 10_000, 100, {}, 1.0, pools).why == "pin"
    assert stick(fresh, sticky, 10_000, 100, {}, 1.0, ["dfly"]).why == "unavailable"
    assert stick(Decision("mtp", "code", "default"), sticky, 0, 100, {}, 1.0, pools).why == "same_pool"


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
            keys = redis.Redis.from_url(redis_url).keys("specroute:conv:*")
            assert keys and 0 < redis.Redis.from_url(redis_url).ttl(keys[0]) <= 1800
            metrics = (await client.get("/metrics")).text
            assert 'specroute_conversation_routes_total{outcome="same_pool",pool="mtp"}' in metrics
