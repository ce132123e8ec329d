"""Small ASGI helpers for the request hot path (router/api/completions.py): read a bounded body, send
a whole response, convert headers, `DisconnectGuard`, which cancels the request's task when its
client goes away, and the connection's cork (router/http/guard.py), when the server offers one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from starlette.types import Receive, Scope, Send

from router.http.errors import APIError

Headers = list[tuple[bytes, bytes]]
JSON_CONTENT_TYPE = (b"content-type", b"application/json")
CORK = "specroute.cork"  # the scope extension of the gateway's HTTP server: the connection's `Cork`


class Cork(Protocol):
    """Holds a connection's writes (`cork`) and sends them as one (`uncork`)."""

    def cork(self) -> None: ...

    def uncork(self) -> None: ...


def cork_of(scope: Scope) -> Cork | None:
    """The connection's cork, when the server offers one (router/http/guard.py; not in tests' ASGI
    transports)."""
    ext = scope.get("extensions")
    return ext.get(CORK) if ext else None


def raw_headers(headers: Mapping[str, str]) -> Headers:
    """`{"name": "value"}` as ASGI header pairs (names lower-cased)."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def header_dict(headers: Headers) -> dict[str, str]:
    """ASGI header pairs as `{"name": "value"}` (for `APIError.headers`)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}


class ClientDisconnected(Exception):
    """The client went away before its request body arrived."""


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", code="request_too_large")


async def read_body(receive: Receive, limit: int, content_length: bytes | None = None) -> bytes:
    """The request body (at most `limit` bytes, else a 413 `APIError`), like Starlette's
    `Request.stream()` but without a `Request` object; `ClientDisconnected` if the client leaves."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise too_large(limit)
    msg = await receive()
    if msg["type"] != "http.request":
        raise ClientDisconnected()
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body", False):  # the whole body in one message (the usual case)
        if len(body) > limit:
            raise too_large(limit)
        return body
    buf = bytearray(body)
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientDisconnected()
        buf += msg.get("body", b"")
        if len(buf) > limit:
            raise too_large(limit)
        if not msg.get("more_body", False):
            return bytes(buf)


async def send_response(send: Send, status: int, headers: Headers, body: bytes, cork: Cork | None = None) -> None:
    """A complete response with a `content-length` (`headers` should carry the content type), head
    and body in one write when the connection has a `cork`."""
    headers.append((b"content-length", b"%d" % len(body)))
    if cork is None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    cork.cork()
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    finally:
        cork.uncork()


class DisconnectGuard:
    """Cancel the current task as soon as the client disconnects, so that a disconnect cancels the
    gRPC call wherever the request is waiting (the worker frees the request's slot) and `finally`
    blocks run. Catch the `CancelledError` and ask `caused_cancel()` whether it came from here.

    The watcher (a task blocked in `receive()`) starts only after `grace_s`: most requests on a
    loaded gateway are over sooner and never pay for a second task, and a client that left earlier
    is seen the moment the watcher starts (`receive()` then answers `http.disconnect` at once).
    After `close()` nothing is cancelled any more.
    """

    __slots__ = ("_receive", "_task", "_timer", "_watcher", "disconnected")

    def __init__(self, receive: Receive, grace_s: float = 0.05) -> None:
        self._receive = receive
        self._task = asyncio.current_task()
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected = False
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(grace_s, self._start)

    def _start(self) -> None:
        self._timer = None
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                self.disconnected = True
                if self._task is not None:
                    self._task.cancel()
                return

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def caused_cancel(self) -> bool:
        """Whether the `CancelledError` being handled is this guard's doing; if so the task's
        cancellation request is withdrawn (the request ends quietly instead of being torn down)."""
        if not self.disconnected:
            return False
        if self._task is not None:
            self._task.uncancel()
        return True
