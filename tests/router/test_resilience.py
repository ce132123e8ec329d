"""Issue #13's gateway items, one test each: Retry-After, over-long prompts refused by their size before
any worker sees them, the context error's `param`, legacy `functions`, long stop strings, null bytes,
`/health`, degraded readiness, policies that serve nothing (refused unless forced, and audited),
policy size caps, failed admin logins, the audit actor of an unnamed token, token files, and the
end of a stream when the gateway stops. (HTTP read timeouts and the connection cap:
tests/router/test_http_guard.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
import pytest
import uvicorn

from router.http.guard import uvicorn_options
from router.settings import token_name
from specroute.contracts.limits import MAX_STOP_CHARS, prompt_byte_limit
from tests.redis_server import free_port
from tests.router.conftest import ADMIN, engines, keyword_classify, running_app, settings_for, sse_events
from tests.router.fake_engine import FakeConfig

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


async def test_retry_after_on_503_and_429(redis_url: str) -> None:
    async with engines(FakeConfig(fail="overloaded")) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url)
    ) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        await es[0].stop()
        await asyncio.sleep(0.3)  # the health check sees the worker gone
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["status"] == "not ready"


async def test_over_long_prompt_is_refused_by_its_size_before_any_worker(redis_url: str) -> None:
    async with engines(FakeConfig(max_context=256)) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url)
    ) as c:
        big = "x" * (prompt_byte_limit(256) + 1)
        r = await c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": big}]})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"
        assert "bytes" in err["message"]
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "é" * (prompt_byte_limit(256) // 2 + 1)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert es[0].servicer.requests == []  # no worker tokenized anything
        r = await c.post("/v1/chat/completions", json=CHAT)  # under the bound: served as usual
        assert r.status_code == 200


async def test_worker_context_error_names_the_prompt(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url)) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "TOO_LONG"}]})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "TOO_LONG"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


async def test_request_validation_items(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url)) as c:
        async def err(body: dict) -> dict:
            r = await c.post("/v1/chat/completions", json={**CHAT, **body})
            assert r.status_code == 400, r.text
            return r.json()["error"]

        # legacy `functions` / `function_call` are refused like `tools`, not silently ignored
        e = await err({"functions": [{"name": "f", "parameters": {}}]})
        assert (e["param"], e["code"]) == ("functions", "unsupported_parameter")
        e = await err({"function_call": {"name": "f"}})
        assert e["param"] == "function_call"
        assert (await c.post("/v1/chat/completions", json={**CHAT, "function_call": "none"})).status_code == 200
        # long stop strings: the gateway's own wording, with `param`
        e = await err({"stop": "s" * (MAX_STOP_CHARS + 1)})
        assert e["param"] == "stop" and f"at most {MAX_STOP_CHARS} characters" in e["message"]
        assert "worker" not in e["message"]
        e = await err({"stop": ["ok", "t" * (MAX_STOP_CHARS + 1)]})
        assert e["param"] == "stop"
        # null bytes in content
        e = await err({"messages": [{"role": "user", "content": "a\u0000b"}]})
        assert (e["param"], e["code"]) == ("messages.0.content", "invalid_value")
        e = await err({"messages": [{"role": "user", "content": [{"type": "text", "text": "\u0000"}]}]})
        assert e["param"] == "messages.0.content"
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x\u0000"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert es[0].servicer.requests[-1].messages[0].content == "hello"  # none of those reached it


async def test_health_alias_and_degraded_readiness(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
    ) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready" and r.json()["reasons"] == []
        await es[1].stop()
        await asyncio.sleep(0.3)
        r = await c.get("/readyz")
        body = r.json()
        assert r.status_code == 200 and body["status"] == "degraded"  # serving, on the other pool
        assert body["pools"]["dfly"]["healthy"] is False and "dfly" in body["reason"]
        code = {**CHAT, "messages": [{"role": "user", "content": "write python code"}]}
        r = await c.post("/v1/chat/completions", json=code)
        assert r.status_code == 200 and r.headers["x-specroute-reason"] == "fallback"


async def _policy(c: httpx.AsyncClient) -> tuple[dict, str]:
    r = await c.get("/admin/policy", headers=ADMIN)
    return r.json(), r.headers["etag"]


async def test_policy_that_serves_nothing_is_refused_unless_forced(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url)
    ) as c:
        doc, etag = await _policy(c)
        ghost = {**doc, "pools": ["ghost"], "defaults": {d: "ghost" for d in doc["domains"]}, "safe_pool": "ghost",
                 "fallback_order": [], "candidates": {}}
        drained = {**doc, "pools": [*doc["pools"], "phantom"], "drained": ["mtp", "dfly"]}
        for bad in (ghost, drained):
            r = await c.put("/admin/policy", json=bad, headers={**ADMIN, "if-match": etag})
            err = r.json()["error"]
            assert r.status_code == 409 and err["code"] == "policy_serves_nothing" and "force=true" in err["message"]
            v = (await c.post("/admin/policy/validate", json=bad, headers=ADMIN)).json()
            assert v["valid"] is False and v["forceable"] is True and "no pool" in v["errors"][0]
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200  # nothing changed

        r = await c.put("/admin/policy?force=true", json=ghost, headers={**ADMIN, "if-match": etag})
        assert r.status_code == 200 and r.json()["version"] == 2
        ready = await c.get("/readyz")
        assert ready.status_code == 503 and "no pool" in ready.json()["reason"]
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        hist = (await c.get("/admin/policy/versions", headers=ADMIN)).json()["versions"]
        assert hist[0]["forced"] is True and hist[0]["overridden"] and hist[0]["actor"] == "ops"
        assert "forced" not in hist[1]
        # a rollback to a good version needs no force; one to the bad version again does
        r = await c.post("/admin/policy/rollback", json={"version": 1}, headers=ADMIN)
        assert r.status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        r = await c.post("/admin/policy/rollback", json={"version": 2}, headers=ADMIN)
        assert r.status_code == 409


async def test_policy_size_is_capped(redis_url: str) -> None:
    from router.routing.policy import MAX_DOMAINS, MAX_POOLS

    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url)) as c:
        doc, etag = await _policy(c)
        domains = [f"d{i}" for i in range(MAX_DOMAINS + 1)]
        many_domains = {**doc, "domains": domains, "defaults": dict.fromkeys(domains, "mtp")}
        pools = ["mtp", *(f"p{i}" for i in range(MAX_POOLS))]
        many_pools = {**doc, "pools": pools, "candidates": {"chat": pools}}
        for bad, word in ((many_domains, "domains"), (many_pools, "pools")):
            r = await c.put("/admin/policy", json=bad, headers={**ADMIN, "if-match": etag})
            assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
        long_name = {**doc, "pools": ["mtp", "p" * 65]}
        r = await c.put("/admin/policy", json=long_name, headers={**ADMIN, "if-match": etag})
        assert r.status_code == 400 and "longer than 64" in r.json()["error"]["message"]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_failed_admin_logins_are_recorded(redis_url: str) -> None:
    # a handler on the admin logger itself: what other tests did to the root logger cannot hide the lines
    logger, records = logging.getLogger("specroute.gateway.admin"), _Records()
    logger.addHandler(records)
    level, logger.level = logger.level, logging.WARNING
    try:
        async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url)) as c:
            assert (await c.get("/admin/policy", headers={"authorization": "Bearer nope"})).status_code == 401
            assert (await c.get("/admin/pools")).status_code == 401
            m = (await c.get("/metrics")).text
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert not logger.disabled
    lines = [r.getMessage() for r in records.records if "admin login failed" in r.getMessage()]
    assert len(lines) == 2 and "wrong token" in lines[0] and "no token" in lines[1]
    assert "nope" not in " ".join(lines)
    assert "specroute_admin_auth_failures_total 2.0" in m


async def test_unnamed_admin_token_is_audited_by_fingerprint(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url, admin_tokens="plain-token-0123456789")
    ) as c:
        auth = {"authorization": "Bearer plain-token-0123456789"}
        doc = (await c.get("/admin/policy", headers=auth)).json()
        r = await c.put("/admin/policy", json={**doc, "exploration_rate": 0.0}, headers={**auth, "if-match": "*"})
        assert r.status_code == 200
        hist = (await c.get("/admin/policy/versions", headers=auth)).json()["versions"]
        assert hist[0]["actor"] == token_name("plain-token-0123456789") != "default"
        assert "plain-token-0123456789" not in str(hist)


async def test_stream_cut_by_shutdown_ends_with_an_error_event(redis_url: str) -> None:
    """When the gateway stops and its drain deadline passes, an open stream gets an OpenAI error
    event (`shutting_down`), not a bare cut."""
    from router.app import create_app

    async with engines(FakeConfig(token_delay_s=0.1, default_max_tokens=200)) as es:
        settings = settings_for({"mtp": [es[0].address]}, redis_url, drain_timeout_s=0.3)
        app = create_app(settings, classify=keyword_classify)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                               **uvicorn_options(settings)))
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        text = ""
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client, client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 200, "stream": True}
        ) as r:
            async for line in r.aiter_lines():
                text += line + "\n\n"
                if "Hello" in line:
                    server.should_exit = True  # as on SIGTERM
        await asyncio.wait_for(task, 10)
        events = sse_events(text)
        assert events[-1]["error"]["code"] == "shutting_down", events[-2:]
        for _ in range(100):  # the worker call is cancelled (it sees that a moment later)
            if es[0].servicer.cancelled:
                break
            await asyncio.sleep(0.02)
        assert es[0].servicer.cancelled == 1
