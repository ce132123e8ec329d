"""router/http/asgi.py: bounded body reads and the disconnect guard of the request hot path."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from router.http.asgi import ClientDisconnected, DisconnectGuard, read_body
from router.http.errors import APIError

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(30)]


def messages(*msgs: dict[str, Any], then: asyncio.Event | None = None) -> Callable[[], Awaitable[dict[str, Any]]]:
    """An ASGI `receive` that answers `msgs` in order, then (once `then` is set) `http.disconnect`."""
    queue = list(msgs)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        if then is not None:
            await then.wait()
        return {"type": "http.disconnect"}

    return receive


async def test_read_body() -> None:
    assert await read_body(messages({"type": "http.request", "body": b"abc"}), 10) == b"abc"
    parts = messages({"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request", "body": b"c"})
    assert await read_body(parts, 10) == b"abc"
    with pytest.raises(APIError) as e:
        await read_body(messages({"type": "http.request", "body": b"abc"}), 10, b"11")
    assert e.value.status == 413 and e.value.code == "request_too_large"
    big = messages(*({"type": "http.request", "body": b"x" * 6, "more_body": True} for _ in range(3)))
    with pytest.raises(APIError):
        await read_body(big, 10)
    with pytest.raises(ClientDisconnected):
        await read_body(messages({"type": "http.request", "body": b"ab", "more_body": True}), 10)


async def test_disconnect_guard_cancels_only_on_disconnect() -> None:
    gone = asyncio.Event()

    async def request(receive: Callable[[], Awaitable[dict[str, Any]]], work_s: float) -> str:
        guard = DisconnectGuard(receive, grace_s=0.01)
        try:
            await asyncio.sleep(work_s)
            return "done"
        except asyncio.CancelledError:
            if guard.caused_cancel():
                return "client gone"
            raise
        finally:
            guard.close()

    # the client stays: the work finishes, the watcher is stopped
    assert await request(messages(then=gone), 0.05) == "done"
    # the client leaves mid-request: the task is cancelled, and the guard owns up to it
    leave = asyncio.get_running_loop().call_later(0.03, gone.set)
    task = asyncio.ensure_future(request(messages(then=gone), 5.0))
    assert await asyncio.wait_for(task, 2.0) == "client gone"
    assert not task.cancelled() and task.cancelling() == 0
    leave.cancel()
    # a request over before the grace period never starts a watcher (no receive() at all)
    calls = 0

    async def counting() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {"type": "http.disconnect"}

    assert await request(counting, 0.0) == "done"
    await asyncio.sleep(0.03)
    assert calls == 0
