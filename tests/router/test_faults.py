"""Faults: workers failing before or during a stream, retries and fallbacks, the circuit breaker,
deadlines, client disconnects; and the official openai client (sync + async) through real uvicorn."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.router.conftest import ADMIN, engines, running_app, settings_for, sse_events, uvicorn_app
from tests.router.fake_engine import FakeConfig, fake_text

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}


async def test_retry_on_other_endpoint_before_first_token(redis_url: str) -> None:
    async with engines(FakeConfig(fail="before_first"), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address, es[1].address]}, redis_url)
    ) as c:
        for _ in range(6):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.headers["x-specroute-pool"] == "mtp"
        assert es[1].servicer.completed == 6
        pools = (await c.get("/admin/pools", headers=ADMIN)).json()
        bad = next(e for e in pools["mtp"]["endpoints"] if e["address"] == es[0].address)
        assert bad["consecutive_failures"] >= 1 and "down" in bad["last_error"]


async def test_fallback_pool_when_a_pool_fails(redis_url: str) -> None:
    async with engines(FakeConfig(fail="before_first"), FakeConfig()) as es, running_app(
        settings_for({"dfly": [es[0].address], "mtp": [es[1].address]}, redis_url, breaker_failures=2)
    ) as c:
        req = {**CHAT, "messages": [{"role": "user", "content": "python code please"}]}
        for _ in range(4):
            r = await c.post("/v1/chat/completions", json=req)
            assert r.status_code == 200
            assert (r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]) == ("mtp", "fallback")
            assert r.json()["specroute"]["reason"] == "fallback"
            await asyncio.sleep(0.15)  # the health check (0.1 s) finds the worker process alive again
        m = (await c.get("/metrics")).text
        assert 'specroute_fallbacks_total{from="dfly",reason="unavailable",to="mtp"}' in m
        gw = c.app.state.gateway  # type: ignore[attr-defined]
        ep = gw.pools.pools["dfly"][0]
        assert ep.failures >= 2 and ep.breaker_state in ("open", "half_open")


async def test_invalid_argument_is_not_retried(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address, es[1].address]}, redis_url)
    ) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "TOO_LONG"}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert len(es[0].servicer.requests) + len(es[1].servicer.requests) == 1


async def _kill_mid_request(c: httpx.AsyncClient, es: list, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    """`body` sent while the slow endpoint (es[0]) is the least loaded; es[0] stopped once it started."""
    gw = c.app.state.gateway  # type: ignore[attr-defined]
    other = gw.pools.pools["mtp"][1] if len(gw.pools.pools["mtp"]) > 1 else None
    if other is not None:
        other.worker.inflight = 5   # what every pool has in flight on that worker
    task = asyncio.create_task(c.post("/v1/chat/completions", json=body))
    while es[0].servicer.running == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.12)
    await es[0].stop()  # the worker dies mid-request
    r = await task
    if other is not None:
        other.worker.inflight = 0
    return r


async def test_worker_killed_mid_stream_continues_on_another_endpoint(redis_url: str) -> None:
    slow = FakeConfig(token_delay_s=0.05, default_max_tokens=40)
    async with engines(slow, FakeConfig(token_delay_s=0.0)) as es, running_app(
        settings_for({"mtp": [es[0].address, es[1].address]}, redis_url)
    ) as c:
        body = {**CHAT, "max_tokens": 40, "stream": True, "stream_options": {"include_usage": True}}
        r = await _kill_mid_request(c, es, body)
        ev = sse_events(r.text)
        assert r.status_code == 200 and ev[-1] == "[DONE]" and not any("error" in e for e in ev[:-1])
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev[:-1] if e.get("choices"))
        assert text == "".join(fake_text(40))  # the continuation picks up exactly where the dead worker was
        usage = next(e["usage"] for e in ev[:-1] if e.get("usage"))
        assert usage["completion_tokens"] == 40 and usage["prompt_tokens"] == 1
        cont = es[1].servicer.requests[-1]
        assert 0 < len(cont.prefix_token_ids) < 40 and cont.prefix_chars == len("".join(fake_text(len(cont.prefix_token_ids))))
        assert 'specroute_migrations_total{from_pool="mtp",to_pool="mtp"} 1.0' in (await c.get("/metrics")).text
        for _ in range(5):  # the next requests go to the healthy endpoint
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200
        assert es[1].servicer.completed == 6


async def test_worker_killed_mid_answer_is_retried_elsewhere(redis_url: str) -> None:
    slow = FakeConfig(token_delay_s=0.05, default_max_tokens=40)
    async with engines(slow, FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address, es[1].address]}, redis_url)
    ) as c:
        r = await _kill_mid_request(c, es, {**CHAT, "max_tokens": 40})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "".join(fake_text(40))
        assert r.json()["usage"]["completion_tokens"] == 40


async def test_stream_ends_with_an_error_event_when_no_other_endpoint_serves(redis_url: str) -> None:
    slow = FakeConfig(token_delay_s=0.05, default_max_tokens=40)
    async with engines(slow) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url)) as c:
        r = await _kill_mid_request(c, es, {**CHAT, "max_tokens": 40, "stream": True})
        ev = sse_events(r.text)
        assert r.status_code == 200 and ev[-1] != "[DONE]"
        assert "error" in ev[-1] and ev[-1]["error"]["type"] in ("service_unavailable", "server_error")
        assert any(e.get("choices") and e["choices"][0]["delta"].get("content") for e in ev[:-1])


async def test_deadline(redis_url: str) -> None:
    async with engines(FakeConfig(token_delay_s=0.2)) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url, request_timeout_s=0.3)
    ) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"


async def test_client_disconnect_cancels_the_grpc_call(redis_url: str) -> None:
    async with engines(FakeConfig(token_delay_s=0.05, default_max_tokens=200)) as es, uvicorn_app(
        settings_for({"mtp": [es[0].address]}, redis_url)
    ) as (url, _app):
        body = {**CHAT, "max_tokens": 200, "stream": True}
        async with httpx.AsyncClient(base_url=url, timeout=10) as client, client.stream(
            "POST", "/v1/chat/completions", json=body
        ) as r:
            n = 0
            async for _line in r.aiter_lines():
                n += 1
                if n > 6:
                    break
        t0 = time.perf_counter()
        while es[0].servicer.cancelled == 0 and time.perf_counter() - t0 < 5:
            await asyncio.sleep(0.02)
        assert es[0].servicer.cancelled == 1 and es[0].servicer.running == 0
        # non-streaming too
        async with httpx.AsyncClient(base_url=url, timeout=0.3) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 200})
        t0 = time.perf_counter()
        while es[0].servicer.cancelled < 2 and time.perf_counter() - t0 < 5:
            await asyncio.sleep(0.02)
        assert es[0].servicer.cancelled == 2


async def test_official_openai_client_sync_and_async(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, uvicorn_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, api_keys="key-1-0123456789abcdef")
    ) as (url, _app):
        def sync_calls() -> tuple[str, str, list[str]]:
            client = openai.OpenAI(base_url=url + "/v1", api_key="key-1-0123456789abcdef", max_retries=0)
            models = [m.id for m in client.models.list()]
            r = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, temperature=0)
            stream = client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
                stream_options={"include_usage": True},
            )
            text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
            assert r.usage is not None and r.usage.completion_tokens == 4
            return r.choices[0].message.content or "", text, models

        full, streamed, models = await asyncio.to_thread(sync_calls)
        assert full == streamed == "Hello from the fake" and "fake-model" in models

        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="key-1-0123456789abcdef", max_retries=0)
        r = await client.completions.create(model="fake-model", prompt="def f():", max_tokens=3)
        assert r.choices[0].text == "Hello from the"
        chunks = []
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "write python code"}], max_tokens=3,
            stream=True,
        )
        async for ch in stream:
            chunks.append(ch)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello from the"
        assert chunks[-1].model_extra and chunks[-1].model_extra["specroute"]["pool"] == "dfly"
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="fake-model", messages=[], max_tokens=2)
        bad = openai.AsyncOpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
        await client.close()
        await bad.close()
