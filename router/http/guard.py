"""Connection guards of the gateway's HTTP server: read timeouts and a connection cap.

uvicorn has no header or body read timeout (a client that sends half a request holds its connection
and a task forever) and its `limit_concurrency` answers with a plain-text 503. So the gateway runs
uvicorn with this small subclass of its httptools protocol (`uvicorn_options(settings)`):

- a client has `header_timeout_s` from connecting (or from the first byte of a further request on a
  kept-alive connection) to send a request's headers, then `body_timeout_s` to send its body; past
  either it gets a 408 OpenAI error and the connection is closed (the handler waiting for the body
  sees a disconnect). Idle kept-alive connections close after `keepalive_timeout_s` (uvicorn's own).
- a connection beyond `max_connections` gets a 503 OpenAI error with `Retry-After` and is closed.

It also lets the completion handler cork the connection (`CorkedTransport`, offered to the app as
the scope extension `CORK`): the pieces of a response (uvicorn writes its head and each body message
as they come) are held and then written at once, one `send` and one TCP segment for the client to
read instead of several.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from router.http.asgi import CORK
from router.http.errors import RETRY_AFTER_S, APIError
from router.settings import Settings


class CorkedTransport:
    """A connection's transport whose writes can be held (`cork`) and then written as one (`uncork`,
    also on `close`); everything else is the transport's own."""

    __slots__ = ("_transport", "_held")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: list[bytes] | None = None

    def cork(self) -> None:
        if self._held is None:
            self._held = []

    def uncork(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._transport.write(data)
        else:
            self._held.append(data)

    def close(self) -> None:
        self.uncork()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines and a connection cap (class attributes,
    set per server by `guarded_protocol`)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 2048

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, CorkedTransport(transport))
        if len(self.connections) > self.max_connections:
            self._refuse(APIError(503, f"the gateway has {self.max_connections} connections open; retry shortly",
                                  code="too_many_connections"))
            return
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope.setdefault("extensions", {})[CORK] = self.transport  # type: ignore[typeddict-item]
        if self._deadline is None:  # a further request on a kept-alive connection
            self._arm("headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm("body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # -- deadlines ---------------------------------------------------------------------------------
    def _arm(self, what: str) -> None:
        self._disarm()
        limit = self.header_timeout_s if what == "headers" else self.body_timeout_s
        self._deadline = self.loop.call_later(limit, self._expire, what, limit)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, what: str, limit: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.pipeline:  # reading is paused behind a pipelined request: not the client's fault
            self._arm(what)
            return
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if answering or (what == "body" and cycle is not None and cycle.response_complete):
            self.transport.close()  # a response is under way or done: only stop reading
            return
        if what == "body" and cycle is not None:
            cycle.disconnected = True  # the handler waiting for this body sees a disconnect
            cycle.message_event.set()
        self._refuse(APIError(408, f"request {what} not received within {limit:g} s", code="request_timeout"))

    def _refuse(self, err: APIError) -> None:
        """Answer `err` (OpenAI error JSON) outside any request cycle, and close the connection."""
        body = orjson.dumps(err.body())
        head = [STATUS_LINE[err.status], b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body), b"connection: close\r\n"]
        if err.status in (429, 503):
            head.append(b"retry-after: %d\r\n" % RETRY_AFTER_S)
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.transport.close()


def guarded_protocol(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one server, with the limits of `settings`."""
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), {
        "header_timeout_s": settings.header_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "max_connections": settings.max_connections,
    })


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The connection-handling options of `uvicorn.run`/`uvicorn.Config` for the gateway."""
    return {
        "http": guarded_protocol(settings),
        "timeout_keep_alive": settings.keepalive_timeout_s,
        "timeout_graceful_shutdown": settings.drain_timeout_s,
    }
