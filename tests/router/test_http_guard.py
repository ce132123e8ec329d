"""router/http_guard.py through a real uvicorn server: half-sent headers or bodies get a 408 and the
connection closed within the read timeouts; connections over the cap get a 503 with Retry-After;
well-behaved clients (including kept-alive connections) are not affected."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.router.conftest import engines, settings_for, uvicorn_app
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
