"""OpenAI API semantics and errors, through the real app with fake engine workers on loopback gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from router.api import openai
from tests.router.conftest import engines, running_app, settings_for, sse_events
from tests.router.fake_engine import FakeConfig, FakeEngine, fake_text

# one event loop for the whole session: grpc.aio does not like a fresh loop per test
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5,
        "temperature": 0}


@asynccontextmanager
async def env(redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, list[FakeEngine]]]:
    # (a context manager used inside each test, not an async fixture: the app's lifespan and the
    # gRPC servers must be entered and exited in the same task)
    async with engines(FakeConfig(name="mtp", engine="mtp"), FakeConfig(name="dfly", engine="dfly")) as es:
        s = settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
        async with running_app(s) as client:
            yield client, es


async def test_chat_completion_non_streaming(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion" and body["model"] == "fake-model"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello from the fake engine"}
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}
        spec = body["specroute"]
        assert spec["domain"] == "chat" and spec["pool"] == "mtp" and spec["steps"] > 0
        assert spec["mean_accepted_length"] > 1
        h = r.headers
        assert (h["x-specroute-domain"], h["x-specroute-pool"], h["x-specroute-reason"]) == ("chat", "mtp", "default")
        assert h["x-specroute-policy-version"] == "1" and float(h["x-specroute-overhead-ms"]) >= 0
        req = es[0].servicer.requests[-1]
        assert [(m.role, m.content) for m in req.messages] == [("user", "hi there")]
        assert req.sampling.temperature == 0 and req.max_tokens == 5 and req.domain == "chat" and req.pool == "mtp"


async def test_non_streaming_is_one_unary_call_or_a_coalesced_stream(redis_url: str) -> None:
    # workers answer `Complete` (one message); a worker without it (UNIMPLEMENTED) is asked with a
    # coalesced `Generate` from then on: the first chunk, then one final chunk (or one per token when
    # it ignores `coalesce`, an older worker still)
    for unary, honours in ((True, True), (False, True), (False, False)):
        async with engines(FakeConfig(coalesce=honours, unary=unary)) as es, running_app(
            settings_for({"mtp": [es[0].address]}, redis_url)
        ) as client:
            for _ in range(2):
                r = await client.post("/v1/chat/completions", json=CHAT)
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["choices"][0]["message"]["content"] == "Hello from the fake engine"
                assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}
            assert es[0].servicer.requests[-1].coalesce
            assert es[0].servicer.unary_calls == (2 if unary else 1)   # asked once, then remembered
            r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in sse_events(r.text)[:-1] if c["choices"])
            assert text == "Hello from the fake engine" and not es[0].servicer.requests[-1].coalesce


async def test_framework_route_serves_the_same_endpoints(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a root path the app's fast path steps aside and FastAPI's routes run the same handler."""
    routed_calls = []
    endpoint_call = openai.ASGIEndpoint.__call__

    async def spy(self: openai.ASGIEndpoint, scope: Any, receive: Any, send: Any) -> None:
        routed_calls.append(scope["path"])
        await endpoint_call(self, scope, receive, send)

    monkeypatch.setattr(openai.ASGIEndpoint, "__call__", spy)
    async with env(redis_url) as (client, es):
        app = client.app  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app, root_path="/gw")
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=10) as routed:
            for c, prefix in ((client, ""), (routed, "/gw")):
                r = await c.post(prefix + "/v1/chat/completions", json=CHAT)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == "Hello from the fake engine"
                assert r.headers["x-specroute-domain"] == "chat" and r.headers["content-type"] == "application/json"
                r = await c.post(prefix + "/v1/completions", json={"model": "fake-model", "prompt": "x", "stream": True,
                                                                   "max_tokens": 2})
                assert sse_events(r.text)[-1] == "[DONE]"
                r = await c.post(prefix + "/v1/chat/completions", content=b"{nope",
                                 headers={"content-type": "application/json"})
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
                r = await c.get(prefix + "/v1/chat/completions")
                assert r.status_code == 405 and "error" in r.json()
                assert len(routed_calls) == (3 if prefix else 0)  # the fast path skips the framework


@pytest.mark.parametrize(
    ("content", "domain", "pool", "reason"),
    [
        ("write python code for quicksort", "code", "dfly", "default"),
        ("solve 12 + 30 = ?", "math", "dfly", "default"),
        ("tell me about your day", "chat", "mtp", "default"),
        ("something ambiguous", "chat", "mtp", "uncertain"),
    ],
)
async def test_default_routing(
    redis_url: str, content: str, domain: str, pool: str, reason: str
) -> None:
    async with env(redis_url) as (client, es):
        # exploration is on by default; pin the RNG outcome by turning it off for a deterministic check
        await _set_policy(client, exploration_rate=0.0)
        r = await client.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200
        h = r.headers
        assert (h["x-specroute-domain"], h["x-specroute-pool"], h["x-specroute-reason"]) == (domain, pool, reason)


async def _set_policy(client: httpx.AsyncClient, **changes: object) -> dict:
    from tests.router.conftest import ADMIN

    g = await client.get("/admin/policy", headers=ADMIN)
    doc = {**g.json(), **changes}
    r = await client.put("/admin/policy", json=doc, headers={**ADMIN, "if-match": g.headers["etag"]})
    assert r.status_code == 200, r.text
    return r.json()


async def test_chat_streaming_with_usage(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                            "stream_options": {"include_usage": True}})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-specroute-pool"] == "mtp"
        ev = sse_events(r.text)
        assert ev[-1] == "[DONE]"
        chunks = ev[:-1]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "Hello from the fake engine"
        finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "length"
        last = chunks[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
        assert last["specroute"]["pool"] == "mtp"
        assert all(c["object"] == "chat.completion.chunk" and "usage" in c for c in chunks)


async def test_streaming_without_usage_puts_stats_in_last_chunk(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        ev = sse_events(r.text)
        assert ev[-1] == "[DONE]" and "usage" not in ev[0]
        assert ev[-2]["choices"][0]["finish_reason"] == "length" and ev[-2]["specroute"]["domain"] == "chat"


async def test_multi_token_chunks_stream_every_token_in_order(redis_url: str) -> None:
    # a worker sends the deltas that were ready together as one chunk (engines/worker/server.py), and
    # speculative engines emit several tokens per step: one SSE event per chunk, every token, in order
    cfg = {"chunk_tokens": 3, "default_acceptance": 0.5}
    async with engines(FakeConfig(name="mtp", engine="mtp", **cfg), FakeConfig(name="dfly", engine="dfly", **cfg)) as es:
        s = settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
        async with running_app(s) as client:
            r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 8, "stream": True})
            ev = sse_events(r.text)
            assert ev[-1] == "[DONE]"
            deltas = [e["choices"][0]["delta"].get("content") for e in ev[:-1]]
            assert deltas == ["", "Hello", " from the fake", " engine. One", " two", None]
            assert ev[-2]["choices"][0]["finish_reason"] == "length"
            r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 8})
            b = r.json()
            assert b["choices"][0]["message"]["content"] == "".join(fake_text(8))
            assert b["usage"]["completion_tokens"] == 8


async def test_completions(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "Once upon", "max_tokens": 3,
                                                       "seed": 7})
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["object"] == "text_completion" and b["choices"][0]["text"] == "Hello from the"
        req = es[0].servicer.requests[-1]
        assert req.prompt == "Once upon" and req.sampling.has_seed and req.sampling.seed == 7
        assert req.sampling.temperature == 1.0  # OpenAI default when omitted
        r = await client.post("/v1/completions", json={"model": "fake-model", "prompt": ["Once"], "stream": True})
        ev = sse_events(r.text)
        assert ev[-1] == "[DONE]" and "".join(e["choices"][0]["text"] for e in ev[:-1]).startswith("Hello from")


async def test_stop_sequences(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stop": [" fake", "zzz"]})
        assert r.json()["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "Hello from the"},
                                          "logprobs": None, "finish_reason": "stop"}
        assert list(es[0].servicer.requests[-1].stop) == [" fake", "zzz"]
        r = await client.post("/v1/chat/completions", json={**CHAT, "stop": "x", "max_completion_tokens": 2})
        assert es[0].servicer.requests[-1].max_tokens == 2 and list(es[0].servicer.requests[-1].stop) == ["x"]


async def test_models(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.get("/v1/models")
        ids = [m["id"] for m in r.json()["data"]]
        assert ids == ["fake-model", "specroute"] and r.json()["object"] == "list"
        # which pools serve each model (the alias: every pool), with their engine: a vLLM pool shows as one
        pools = {m["id"]: sorted(p["pool"] for p in m["specroute"]["pools"]) for m in r.json()["data"]}
        assert pools["fake-model"] == pools["specroute"] and pools["fake-model"]
        assert all(set(p) == {"pool", "engine", "drafter"} for m in r.json()["data"] for p in m["specroute"]["pools"])
        assert (await client.get("/v1/models/fake-model")).json()["specroute"]["pools"]
        assert (await client.get("/v1/models/nope")).json()["error"]["code"] == "model_not_found"
        # the alias works as a model name too
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "specroute"})).status_code == 200


BAD = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b'{"model": "fake-model", "messages": "hi"}', 400, "invalid_value"),
    (b'{"model": "fake-model", "messages": []}', 400, "invalid_value"),
    (b'{"model": "fake-model"}', 400, "invalid_value"),
    (b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}', 400, "invalid_value"),
    (b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "n": 17}', 400, "unsupported_parameter"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"}', 400,
     "invalid_value"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "temperature": 9}', 400,
     "invalid_value"),
    (b'{"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]}', 400, "invalid_value"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x TOO_LONG"}]}', 400,
     "context_length_exceeded"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', 400,
     "context_length_exceeded"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}', 400,
     "invalid_value"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}',
     400, "invalid_value"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD)
async def test_bad_input_is_an_openai_error(
    redis_url: str, body: bytes, status: int, code: str
) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]


async def test_oversized_body_and_unknown_routes(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
        r = await client.post("/v1/chat/completions", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = await client.get("/v1/nothing")
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
        r = await client.get("/v1/chat/completions")
        assert r.status_code == 405 and "error" in r.json()


async def test_api_keys(redis_url: str) -> None:
    async with engines(FakeConfig()) as es:
        s = settings_for({"mtp": [es[0].address]}, redis_url, api_keys="alice:key-1-0123456789abcdef,bob:key-2-0123456789abcdef")
        async with running_app(s) as client:
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            r = await client.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer key-2-0123456789abcdef"})
            assert r.status_code == 200
            assert (await client.get("/v1/models")).status_code == 401
            assert (await client.get("/healthz")).status_code == 200


async def test_health_ready_metrics(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        await client.post("/v1/chat/completions", json=CHAT)
        m = (await client.get("/metrics")).text
        for name in ("specroute_requests_total", "specroute_route_decisions_total", "specroute_classify_seconds",
                     "specroute_overhead_seconds", "specroute_ttft_seconds", "specroute_policy_version",
                     "specroute_redis_errors_total", "specroute_fallbacks_total", "specroute_itl_seconds",
                     "specroute_pool_mean_accepted_length"):
            assert name in m, name
        assert 'specroute_requests_total{domain="chat",pool="mtp",status="200"} 1.0' in m
        html = (await client.get("/dashboard")).text
        assert "<html" in html.lower() and "/admin/policy" in html


async def test_not_ready_without_classifier_or_workers(redis_url: str) -> None:
    async with engines(FakeConfig()) as es:
        s = settings_for({"mtp": [es[0].address]}, None)

        def broken(_: object) -> tuple[str, dict[str, float], float]:
            raise RuntimeError("boom")

        async with running_app(s, classify=broken) as client:
            # a classifier crash routes to the safe pool instead of failing
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.headers["x-specroute-reason"] == "uncertain"
        await es[0].stop()
        async with running_app(s) as client:
            r = await client.get("/readyz")
            assert r.status_code == 503 and r.json()["reason"] == "no healthy pool"
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_pool"
            assert r.headers["x-specroute-reason"] == "no_healthy_pool"
