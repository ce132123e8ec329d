"""`n > 1` (one worker call per choice, seeds seed+i, usage summed, streamed with choice indexes) and
`logprobs` (the worker's TokenLogprobs in OpenAI's chat and legacy shapes, whole and streamed), through
the real app with fake engine workers (a named test double) on loopback gRPC; the pure shapes of
router/api/logprobs.py and router/api/choices.py's totals. Cost: ~3 s."""

from __future__ import annotations

import pytest

from router.api.choices import combined
from router.api.logprobs import chat_logprobs, legacy_logprobs
from router.api.openai_wire import Collected
from specroute.v1 import engine_pb2
from tests.router.conftest import sse_events
from tests.router.test_openai_api import CHAT, env

pytestmark = [pytest.mark.timeout(120)]
on_the_session_loop = pytest.mark.asyncio(loop_scope="session")

COMPLETION = {"model": "fake-model", "prompt": "hi there", "max_tokens": 3, "temperature": 0}


def _lp(token: str, logprob: float, top: list[engine_pb2.TokenLogprob] | None = None) -> engine_pb2.TokenLogprob:
    return engine_pb2.TokenLogprob(token_id=1, token=token, token_bytes=token.encode(), logprob=logprob, top=top or [])


def test_logprob_objects_have_openais_shapes():
    entries = [_lp("Hé", -0.5, [_lp("Hé", -0.5), _lp("x", -2.0)]), _lp(" y", -1.25)]
    assert chat_logprobs(entries) == {"refusal": None, "content": [
        {"token": "Hé", "logprob": -0.5, "bytes": list("Hé".encode()),
         "top_logprobs": [{"token": "Hé", "logprob": -0.5, "bytes": list("Hé".encode())},
                          {"token": "x", "logprob": -2.0, "bytes": [120]}]},
        {"token": " y", "logprob": -1.25, "bytes": [32, 121], "top_logprobs": []}]}
    assert legacy_logprobs(entries, offset=4) == {"tokens": ["Hé", " y"], "token_logprobs": [-0.5, -1.25],
                                                  "top_logprobs": [{"Hé": -0.5, "x": -2.0}, {}], "text_offset": [4, 6]}


def test_combined_counts_the_prompt_once_and_sums_the_rest():
    cols = []
    for n, drafted in ((3, 8), (5, 4)):
        c = Collected(0.1 * n)
        c.add(engine_pb2.GenerateChunk(text="a", num_tokens=n, finish_reason="stop", prompt_tokens=7, completion_tokens=n,
                                       stats=engine_pb2.SpecStats(drafted_tokens=drafted, accepted_tokens=2, steps=3,
                                                                  steps_by_drafter={"mtp": 3})))
        cols.append(c)
    total = combined(cols)
    assert total.usage() == {"prompt_tokens": 7, "completion_tokens": 8, "total_tokens": 15,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert total.counts() == (12, 4, 6) and total.steps_by_drafter() == {"mtp": 6}
    assert total.mean_accepted_length() == pytest.approx(10 / 6) and total.ttft_s == pytest.approx(0.3)


@on_the_session_loop
async def test_n_choices_whole_and_streamed(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", json={**CHAT, "n": 3, "seed": 41})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [c["index"] for c in body["choices"]] == [0, 1, 2]
        assert all(c["message"]["content"] == "Hello from the fake engine" for c in body["choices"])
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 15, "total_tokens": 17, "prompt_tokens_details": {"cached_tokens": 0}}
        seeds = sorted(q.sampling.seed for e in es for q in e.servicer.requests[-3:] if q.sampling.has_seed)
        assert seeds[-3:] == [41, 42, 43]
        r = await client.post("/v1/chat/completions", json={**CHAT, "n": 2, "stream": True,
                                                            "stream_options": {"include_usage": True}})
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        texts = {0: "", 1: ""}
        for e in events[:-1]:
            for c in e["choices"]:
                texts[c["index"]] += c["delta"].get("content") or ""
        assert texts == {0: "Hello from the fake engine", 1: "Hello from the fake engine"}
        finishes = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
        assert finishes == ["length", "length"] and events[-2]["usage"]["completion_tokens"] == 10
        r = await client.post("/v1/completions", json={**COMPLETION, "n": 2})
        assert [c["text"] for c in r.json()["choices"]] == ["Hello from the"] * 2


@on_the_session_loop
async def test_logprobs_whole_and_streamed(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2})
        assert r.status_code == 200, r.text
        req = es[0].servicer.requests[-1]
        assert req.logprobs and req.top_logprobs == 2
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert "".join(c["token"] for c in content) == "Hello from the fake engine"
        assert [c["logprob"] for c in content] == [0.0, -0.1, -0.2, -0.3, -0.4]
        assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] for c in content)
        r = await client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "stream": True})
        events = [e for e in sse_events(r.text)[:-1] if e["choices"]]
        streamed = [c for e in events for ch in e["choices"] if ch["logprobs"] for c in ch["logprobs"]["content"]]
        assert [c["logprob"] for c in streamed] == [0.0, -0.1, -0.2, -0.3, -0.4]
        assert all(c["top_logprobs"] == [] for c in streamed)
        r = await client.post("/v1/completions", json={**COMPLETION, "logprobs": 1})
        lp = r.json()["choices"][0]["logprobs"]
        assert lp["tokens"] == ["Hello", " from", " the"] and lp["text_offset"] == [0, 5, 10]
        assert lp["top_logprobs"] == [{"Hello": 0.0}, {" from": -0.1}, {" the": -0.2}]
        r = await client.post("/v1/completions", json={**COMPLETION, "logprobs": 0, "stream": True})
        offsets = [o for e in sse_events(r.text)[:-1] for c in e["choices"] if c["logprobs"]
                   for o in c["logprobs"]["text_offset"]]
        assert offsets == [0, 5, 10]
        r = await client.post("/v1/chat/completions", json=CHAT)
        sent = [q for e in es for q in e.servicer.requests if q.request_id == r.headers["x-request-id"]]
        assert r.json()["choices"][0]["logprobs"] is None and len(sent) == 1 and not sent[0].logprobs
