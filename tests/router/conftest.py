"""Fixtures for the gateway tests: a real redis-server, fake engine workers on loopback gRPC, and
the app driven in-process (httpx ASGITransport with the lifespan run explicitly)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis

from router.app import create_app
from router.settings import Settings
from specroute.contracts.context import GLOBAL_LEVEL
from tests.redis_server import RedisServer
from tests.router.fake_engine import FakeConfig, FakeEngine

ADMIN = {"authorization": "Bearer s3cret-admin-token"}


def keyword_classify(messages: list[dict[str, str]]) -> tuple[str, dict[str, float], float]:
    """Deterministic stand-in for classifier.classify (injected through the app factory)."""
    text = " ".join(m["content"] for m in messages).lower()
    if "ambiguous" in text:
        return "chat", {"chat": 0.4, "code": 0.35, "math": 0.25}, 0.95
    if "def " in text or "python" in text or "code" in text:
        return "code", {"chat": 0.05, "code": 0.9, "math": 0.05}, 0.1
    if re.search(r"\d+\s*[-+*/^=]\s*\d+", text) or "solve" in text:
        return "math", {"chat": 0.05, "code": 0.05, "math": 0.9}, 0.1
    return "chat", {"chat": 0.9, "code": 0.05, "math": 0.05}, 0.1


@pytest.fixture(scope="session")
def redis_srv() -> Iterator[RedisServer]:
    with RedisServer() as r:
        yield r


@pytest.fixture
def redis_url(redis_srv: RedisServer) -> str:
    redis_srv.start()
    redis.Redis.from_url(redis_srv.url).flushall()
    return redis_srv.url


def settings_for(pools: dict[str, list[str]], redis_url: str | None, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(
        pools=pools, redis_url=redis_url, admin_tokens="ops:s3cret-admin-token", health_interval_s=0.1,
        stats_interval_s=0.1, breaker_cooldown_s=1.0, seed=1234,
    )
    base.update(kw)
    return Settings(**base)


@asynccontextmanager
async def running_app(settings: Settings, classify: Callable[..., Any] = keyword_classify) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, classify=classify)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=10) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


@asynccontextmanager
async def engines(*cfgs: FakeConfig) -> AsyncIterator[list[FakeEngine]]:
    started = [await FakeEngine(c).start() for c in cfgs]
    try:
        yield started
    finally:
        for e in started:
            await e.stop()


def sse_events(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


@asynccontextmanager
async def uvicorn_app(settings: Settings, classify: Callable[..., Any] = keyword_classify) -> AsyncIterator[tuple[str, Any]]:
    """The app behind a real uvicorn server on a free loopback port (same event loop as the test)."""
    import asyncio

    import uvicorn

    from router.http.guard import uvicorn_options
    from tests.redis_server import free_port

    app = create_app(settings, classify=classify)
    port = free_port()
    opts = {**uvicorn_options(settings), "timeout_graceful_shutdown": 2}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **opts))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # keep pytest's handlers
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        await task


async def snapshot_holds(gw: object, requests: dict[str, float], timeout_s: float = 20.0) -> None:
    """Wait until the gateway's snapshot holds the feedback of `requests` requests per pool (their
    decayed count at least 90% of it; the workers' feedback writers and the snapshot refresh run on
    their own time, and a loaded machine takes longer than any fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while True:
        cells = gw.snapshot.cells  # type: ignore[attr-defined]
        have = {p: cells[(GLOBAL_LEVEL, p)].n if (GLOBAL_LEVEL, p) in cells else 0.0 for p in requests}
        if all(have[p] >= 0.9 * n for p, n in requests.items()):
            return
        assert time.monotonic() < deadline, f"feedback not in the snapshot after {timeout_s} s: {have}"
        await asyncio.sleep(0.05)
