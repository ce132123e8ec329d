"""Small ASGI helpers: an SSE response that cancels its producer when the client goes away, and a
race between a coroutine and the client's disconnect for non-streaming requests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.responses import Response

T = TypeVar("T")
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


class ClientDisconnected(Exception):
    pass


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg.get("type") == "http.disconnect":
            return


async def race_disconnect(receive: Receive, coro: Awaitable[T]) -> T:
    """Await `coro`; if the client disconnects first, cancel it and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected()


class SSEResponse(Response):
    """`text/event-stream` response; the body iterator is cancelled as soon as the client disconnects
    (its `finally` blocks run, which is where the gRPC call is cancelled)."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> None:
        self.iterator = body
        self.status_code = 200
        self.background = None
        self.extra_headers = dict(headers or {})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.extra_headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": raw_headers})

        async def pump() -> None:
            async for chunk in self.iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await race_disconnect(receive, pump())
        except ClientDisconnected:
            with contextlib.suppress(Exception):
                await self.iterator.aclose()  # type: ignore[attr-defined]
