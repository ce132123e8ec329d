"""router/http/guard.py through a real uvicorn server: half-sent headers or bodies get a 408 and the
connection closed within the read timeouts; connections over the cap get a 503 with Retry-After;
well-behaved clients (including kept-alive connections) are not affected. The connection's cork:
a response's head and body (a stream's first and last events) go out in one write."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from router.api.completions import serve
from router.http.asgi import CORK
from router.http.guard import CorkedTransport
from tests.router.conftest import engines, running_app, settings_for, sse_events, uvicorn_app
from tests.router.fake_engine import FakeConfig

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(60)]

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


async def _raw(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the response, read until the server closes the connection."""
    raw = await asyncio.wait_for(reader.read(), timeout)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def test_half_sent_headers_and_bodies_time_out(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, uvicorn_app(
        settings_for({"mtp": [es[0].address]}, redis_url, header_timeout_s=0.4, body_timeout_s=0.4)
    ) as (url, _app):
        port = int(url.rsplit(":", 1)[1])
        t0 = time.perf_counter()
        silent = await _raw(port, b"")
        partial_head = await _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        body = json.dumps(CHAT).encode()
        partial_body = await _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                                        b"application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body[:10])
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:  # meanwhile, normal service
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        for reader, writer in (silent, partial_head, partial_body):
            status, headers, payload = await _answer(reader)
            assert status == 408 and headers["connection"] == "close"
            assert json.loads(payload)["error"]["code"] == "request_timeout"
            writer.close()
        assert time.perf_counter() - t0 < 3.0
        assert es[0].servicer.requests and len(es[0].servicer.requests) == 1  # the half-sent one never ran


async def test_slow_but_steady_client_and_keep_alive_are_fine(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, uvicorn_app(
        settings_for({"mtp": [es[0].address]}, redis_url, header_timeout_s=0.5, body_timeout_s=0.5)
    ) as (url, _app):
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            for _ in range(3):  # one kept-alive connection, idle between requests for longer than a deadline
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                await asyncio.sleep(0.6)
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(CHAT).encode()
        reader, writer = await _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                                          b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        await asyncio.sleep(0.3)
        writer.write(b"\r\n" + body[:5])
        await asyncio.sleep(0.3)  # each part within its own deadline
        writer.write(body[5:])
        status, _, payload = await _answer(reader)
        assert status == 200 and json.loads(payload)["choices"]
        writer.close()


async def test_connection_cap_answers_503_with_retry_after(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, uvicorn_app(
        settings_for({"mtp": [es[0].address]}, redis_url, max_connections=3, header_timeout_s=5)
    ) as (url, _app):
        port = int(url.rsplit(":", 1)[1])
        held = [await _raw(port, b"") for _ in range(3)]
        await asyncio.sleep(0.1)
        reader, writer = await _raw(port, b"")
        status, headers, payload = await _answer(reader)
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(payload)["error"]["code"] == "too_many_connections"
        writer.close()
        for _, w in held:
            w.close()
        await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:  # room again
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return name


async def test_corked_transport_holds_writes_until_uncorked() -> None:
    raw = _Transport()
    t = CorkedTransport(raw)  # type: ignore[arg-type]
    t.write(b"a")
    t.cork()
    t.write(b"b")
    t.write(b"c")
    assert raw.writes == [b"a"]
    t.uncork()
    t.uncork()
    assert raw.writes == [b"a", b"bc"] and t.get_extra_info("peername") == "peername"
    t.cork()
    t.write(b"d")
    t.close()  # what is held goes out before the connection closes
    assert raw.writes[-1] == b"d" and raw.closed
    t.cork()
    t.write(b"e")
    t.uncork()  # nothing is written to a closing transport
    assert raw.writes[-1] == b"d"


class _Cork:
    def __init__(self, log: list[str]) -> None:
        self.log, self.held = log, False

    def cork(self) -> None:
        if not self.held:
            self.held = True
            self.log.append("cork")

    def uncork(self) -> None:
        if self.held:
            self.held = False
            self.log.append("write")


async def _serve_logged(g: object, stream: bool) -> tuple[list[str], bytes]:
    """One request through the handler with a recording cork: what it sent, in order, and the body."""
    log: list[str] = []
    sent: list[bytes] = []
    body = json.dumps({**CHAT, "stream": stream}).encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "root_path": "",
             "headers": [(b"content-length", b"%d" % len(body))], "extensions": {CORK: _Cork(log)}}
    pending = [{"type": "http.request", "body": body}]

    async def receive() -> dict[str, object]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # the client stays
        return {}

    async def send(msg: dict[str, object]) -> None:
        log.append("start" if msg["type"] == "http.response.start" else "body" if msg.get("more_body") else "end")
        sent.append(msg.get("body", b""))  # type: ignore[arg-type]

    await serve(g, "chat", scope, receive, send)  # type: ignore[arg-type]
    return log, b"".join(sent)


async def test_the_handler_corks_a_response_into_one_write() -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, None)) as c:
        g = c.app.state.gateway  # type: ignore[attr-defined]
        log, _ = await _serve_logged(g, False)
        assert log == ["cork", "start", "end", "write"]
        # head, role event and first token in one write; then each token as it comes; the last events
        # and the terminator in one write
        log, body = await _serve_logged(g, True)
        assert log[:5] == ["cork", "start", "body", "body", "write"]
        assert log[-4:] == ["cork", "body", "end", "write"] and log.count("write") == 2
        assert sse_events(body.decode())[-1] == "[DONE]"


async def test_streams_through_the_corked_server(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, uvicorn_app(settings_for({"mtp": [es[0].address]}, redis_url)) as (
        url, _), httpx.AsyncClient(base_url=url, timeout=5) as client:
        for _ in range(2):
            r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            events = sse_events(r.text)
            assert r.status_code == 200 and events[-1] == "[DONE]" and len(events) >= 4
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
