"""`/v1/chat/completions` and `/v1/completions` as plain ASGI (`serve`): admit -> route -> open -> respond.

These two endpoints are the hot path, so the app (router/app.py) calls `serve` directly for `POST` on
their paths, without the framework's routing, middleware, request and response objects; the FastAPI
routes (router/api/openai.py) run the same handler through `ASGIEndpoint`.

- admit (router/api/admit.py): request id, key, rate limit, body, checks -> `Admitted`;
- route: classify, `decide` (router/routing/decide.py), the key's domains, what fits the pool;
- open: the worker call along the policy's fallback order (router/workers/upstream.py): the unary
  `Complete` for a non-streaming request, the `Generate` stream otherwise; one call per choice for
  `n > 1` (router/api/choices.py);
- respond: the JSON body, or the SSE events (router/api/openai_wire.py builds every byte).

Every outcome is an OpenAI response: the completion, an OpenAI error with its status, or nothing
when the client went away (its worker call cancelled). What the request established is kept on an
`Exchange`; the access-log line, the trace's attributes and the per-key and time-series counts are
built from it once the response is out.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import orjson
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from router.api.admit import Headers, admit, check_prompt_size, client_key, within_limits
from router.api.choices import ChoiceFailed, collect_all, combined, merged, open_all
from router.api.exchange import Exchange, Served, account
from router.api.logprobs import logprobs_object, text_length
from router.api.openai_wire import (
    SSE_HEADERS,
    Api,
    Collected,
    classifier_input,
    decision_headers,
    finish_reason,
    gateway_record,
    generate_request,
    served_reason,
    spec_object,
    sse,
)
from router.api.tool_calls import completion_for
from router.api.turns import conversation_header, remember_turn, turn_of
from router.gateway import Gateway
from router.http.asgi import (
    JSON_CONTENT_TYPE,
    ClientDisconnected,
    DisconnectGuard,
    cork_of,
    header_dict,
    raw_headers,
    send_response,
)
from router.http.errors import APIError, from_grpc, from_upstream
from router.http.request_id import request_id
from router.observability.tracing import RequestTrace
from router.routing.conversation import worker_id
from router.routing.decide import Decision
from router.workers.upstream import Upstream, UpstreamError

log = logging.getLogger("specroute.gateway.api")

_SHUTTING_DOWN = APIError(503, "the gateway is shutting down; retry the request", code="shutting_down")


class Conn:
    """The ASGI side of one request: the connection's calls and its write cork."""

    __slots__ = ("scope", "receive", "send", "cork")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope, self.receive, self.send, self.cork = scope, receive, send, cork_of(scope)

    async def emit(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})


class _Reply:
    """A whole JSON response for `serve` to send."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


_STREAMED = _Reply(200, [], b"")  # the SSE stream went out; only its terminator is left to send


async def serve(g: Gateway, api: Api, scope: Scope, receive: Receive, send: Send) -> None:
    """The whole `/v1/chat/completions` (`api="chat"`) or `/v1/completions` request, as ASGI."""
    t0 = time.perf_counter()
    trace = RequestTrace(g.tracing, "POST " + scope["path"], scope["headers"], time.time_ns()) \
        if g.tracing is not None else None
    ex, conn = Exchange(api, t0, trace), Conn(scope, receive, send)
    try:
        await _answer(g, ex, conn)
    finally:
        if conn.cork is not None:
            conn.cork.uncork()  # a stream's last events (or whatever an error left held) go out now
        account(g, ex)


async def _answer(g: Gateway, ex: Exchange, conn: Conn) -> None:
    try:
        reply = await _complete(g, ex, conn)
    except APIError as exc:
        reply = _error(exc, ex.rid)
    except ClientDisconnected:
        return
    except asyncio.CancelledError:
        # not the client's doing (that ends quietly in `_complete`): the gateway is stopping and its
        # drain deadline passed. The request is over; the client gets an OpenAI error, not a cut.
        _stopped_by_shutdown()
        reply = _error(_SHUTTING_DOWN, None)
    except Exception as exc:  # a bug: a 500 in the OpenAI shape (the FastAPI handler does the same)
        log.exception("unexpected error in %s", conn.scope.get("path"))
        reply = _error(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error"), None)
    if reply is None:
        return
    if reply is _STREAMED:
        await conn.send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    ex.status = reply.status
    await send_response(conn.send, reply.status, reply.headers, reply.body, conn.cork)


async def _complete(g: Gateway, ex: Exchange, conn: Conn) -> _Reply | None:
    headers = Headers(conn.scope, g.conversation_header)
    ex.rid = request_id(headers.request_id)
    ex.key = client_key(g, headers)
    req = ex.request = await admit(g, headers, conn.receive, api=ex.api, rid=ex.rid, key=ex.key)
    ex.reservation = await within_limits(g, req, g.pools.largest_context())
    ex.turn = await turn_of(g, req)
    d = route(g, ex)
    guard = DisconnectGuard(conn.receive)
    try:
        ups = await _open(g, ex)
        if req.stream:
            await _stream(g, ex, ups, conn, guard)
            return _STREAMED
        return await _whole(g, ex, ups, d)
    except asyncio.CancelledError:
        if guard.caused_cancel():
            return None
        raise
    finally:
        guard.close()


def route(g: Gateway, ex: Exchange) -> Decision:
    """Classify and decide (kept on `ex`); refuse what the key may not send to that domain, and what
    the chosen pool cannot fit."""
    req = ex.request
    assert req is not None
    tr = ex.trace if ex.trace is not None and ex.trace.recording else None  # spans to build
    t_cls = time.time_ns() if tr is not None else 0
    label, probs, unc = g.classify(classifier_input(req.body))
    if not probs and label:
        probs = {label: 1.0}
    t_dec = time.time_ns() if tr is not None else 0
    routed = g.route(probs, unc, req.pools, req.context, ex.turn, req.features)
    d = ex.decision = routed.decision
    if routed.shadow is not None:
        ex.shadow_pool = routed.shadow.shadow_pool or "none"
    if req.conversation is not None:
        ex.conversation = conversation_header(routed.verdict)
    if tr is not None:
        tr.phase("classify", t_cls, t_dec, {"specroute.domain": d.domain, "specroute.uncertainty": unc})
        tr.phase("decide", t_dec, time.time_ns(), {"specroute.pool": d.pool, "specroute.reason": d.reason})
    key = req.key
    if key is not None and key.limits.domains and d.domain not in key.limits.domains:
        raise APIError(403, f"API key {key.name!r} may not be used for {d.domain!r} requests.",
                       code="domain_not_allowed")
    if d.pool is None:
        raise APIError(503, "no healthy worker pool can serve this request", code="no_healthy_pool",
                       headers=header_dict(_headers(g, ex, None, time.perf_counter() - ex.t0)))
    max_tokens = req.body.effective_max_tokens()
    mc = g.pools.max_context(d.pool)
    if mc and max_tokens is not None and max_tokens >= mc:
        raise APIError(400, f"max_tokens={max_tokens} does not fit the model's context of {mc} tokens",
                       param="max_tokens", code="context_length_exceeded")
    check_prompt_size(req.body, mc, req.prompt_bytes)
    return d


async def _open(g: Gateway, ex: Exchange) -> list[Upstream]:
    """The worker call of each choice (one unless `n > 1`)."""
    req, d = ex.request, ex.decision
    assert req is not None and d is not None and d.pool is not None
    metadata = ex.trace.upstream(time.time_ns(), d.pool) if ex.trace is not None else None
    prefer = ex.turn.sticky.worker if ex.turn is not None and ex.turn.sticky.pool == d.pool else None
    deadline = time.monotonic() + g.settings.request_timeout_s
    opens = [g.open(d, generate_request(req.body, req.rid, d, i), batch=req.context.batch, deadline=deadline,
                    allowed=req.pools, metadata=metadata, unary=not req.stream, prefer=prefer)
             for i in range(req.body.choices())]
    try:
        return [await opens[0]] if len(opens) == 1 else await open_all(opens)
    except UpstreamError as exc:
        err = from_upstream(exc)
        if err.code == "context_length_exceeded" and err.param is None:
            err.param = req.body.prompt_param
        g.metrics.requests_by(d.domain, d.pool, str(err.status)).inc()
        err.headers.update(header_dict(_headers(g, ex, d.pool, time.perf_counter() - ex.t0)))
        raise err from exc
    except asyncio.CancelledError:
        g.metrics.requests_by(d.domain, d.pool, "499").inc()
        raise


async def _whole(g: Gateway, ex: Exchange, ups: list[Upstream], d: Decision) -> _Reply:
    """The non-streaming answer: collect the worker's chunks (one, from `Complete`) into the JSON body."""
    req = ex.request
    assert req is not None
    up = ups[0]
    g.metrics.ttft_by(up.pool).observe(up.ttft_s)
    cols = [Collected(u.ttft_s) for u in ups]
    try:
        try:
            if len(ups) == 1:
                async for chunk in up.chunks():
                    cols[0].add(chunk)
            else:
                await collect_all(ups, cols)
        except ChoiceFailed as f:
            up = ups[f.index]
            raise f.error from None
        finishes = [finish_reason(c.finish) for c in cols]
    except asyncio.CancelledError:
        _close(ups, False)
        g.metrics.requests_by(d.domain, up.pool, "499").inc()
        raise
    except grpc.aio.AioRpcError as exc:
        _close(ups, False)
        err = _worker_error(up, exc)
        g.metrics.requests_by(d.domain, up.pool, str(err.status)).inc()
        raise err from None
    except APIError:
        _close(ups, False)
        raise
    _close(ups, True)
    up, col = ups[0], combined(cols)
    overhead = max(0.0, time.perf_counter() - ex.t0 - max(u.worker_s for u in ups))
    g.metrics.overhead_seconds.observe(overhead)
    _served(g, ex, up, col, 200)
    out = completion_for(req.api, req.rid, int(time.time()), req.body)
    lp = req.body.top_logprobs_wanted() is not None
    if len(cols) == 1 and not lp:
        body = out.json("".join(col.text), finishes[0], col.usage(), spec_object(d, up.pool, col))
    else:   # n > 1 or logprobs (never with tools: `check_structured` refuses both beside tools)
        choices = [out.choice("".join(c.text), f, stream=False, index=i,
                              logprobs=logprobs_object(req.api, c.logprobs) if lp else None)
                   for i, (c, f) in enumerate(zip(cols, finishes, strict=True))]
        body = out.json("", "", col.usage(), spec_object(d, up.pool, col), choices=choices)
    return _Reply(200, [JSON_CONTENT_TYPE, *_headers(g, ex, up.pool, overhead, up.endpoint.address)], body)


def _close(ups: list[Upstream], ok: bool) -> None:
    for u in ups:
        u.close(ok)


async def _stream(g: Gateway, ex: Exchange, ups: list[Upstream], conn: Conn, guard: DisconnectGuard) -> None:
    """Send the SSE events of one streamed completion (all but the body's terminator). Every way it
    can end is seen by the client: `[DONE]`, or an OpenAI error event (the worker failed, or the
    gateway is stopping), or nothing because the client itself went away."""
    pre_s = time.perf_counter() - ex.t0
    up = ups[0]
    g.metrics.ttft_by(up.pool).observe(up.ttft_s)
    g.metrics.overhead_seconds.observe(pre_s)
    cork = conn.cork
    if cork is not None:  # the head, the role event and the first token: one write
        cork.cork()
    await conn.send({"type": "http.response.start", "status": 200,
                     "headers": [*SSE_HEADERS, *_headers(g, ex, up.pool, pre_s, up.endpoint.address)]})
    cols = [Collected(u.ttft_s) for u in ups]
    status, ok = 500, False
    try:
        try:
            await _events(g, ex, ups, cols, conn)
        except ChoiceFailed as f:
            up = ups[f.index]
            raise f.error from None
        status, ok = 200, True
    except grpc.aio.AioRpcError as exc:
        err = _worker_error(up, exc)
        status = err.status
        await conn.emit(sse(err.body()))
    except APIError as err:
        status = err.status
        await conn.emit(sse(err.body()))
    except Exception as exc:  # a bug: end the stream with an OpenAI error event
        log.exception("unexpected error while streaming")
        await conn.emit(sse(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").body()))
    except asyncio.CancelledError:
        if guard.disconnected:
            status = 499
            raise
        status = 503  # the gateway is stopping and its drain deadline passed: end the stream cleanly
        _stopped_by_shutdown()
        await conn.emit(sse(_SHUTTING_DOWN.body()))
    except BaseException:
        status = 499
        raise
    finally:
        _close(ups, ok)
        _served(g, ex, ups[0], combined(cols), status)


async def _events(g: Gateway, ex: Exchange, ups: list[Upstream], cols: list[Collected], conn: Conn) -> None:
    """The role event, one event per worker chunk (of each choice: n > 1), then the finishing events."""
    req, d = ex.request, ex.decision
    assert req is not None and d is not None
    opts = req.body.stream_options
    out = completion_for(req.api, req.rid, int(time.time()), req.body, bool(opts and opts.include_usage))
    cork, up = conn.cork, ups[0]
    if out.api == "chat":
        await conn.emit(out.role_event(len(ups)))
    lp = req.body.top_logprobs_wanted() is not None
    chunks = merged(ups, g.metrics.itl_by(up.pool).observe) if len(ups) > 1 else \
        ((0, c) async for c in up.chunks(g.metrics.itl_by(up.pool).observe))
    async for i, chunk in chunks:
        if lp and (chunk.text or chunk.logprobs):   # (the offset: where this chunk's tokens start)
            lps = logprobs_object(req.api, chunk.logprobs, text_length(cols[i].logprobs))
            cols[i].add(chunk)
            await conn.emit(out.token_event(chunk.text, i, lps))
        else:
            cols[i].add(chunk)
            if chunk.text:   # one choice: `token_events` (a tool-calling answer parses its text)
                events = out.token_events(chunk.text) if len(ups) == 1 else out.token_event(chunk.text, i)
                if events:
                    await conn.emit(events)
        if cork is not None and not chunk.finish_reason:
            cork.uncork()
    finishes = [finish_reason(c.finish) for c in cols]
    if cork is not None:  # the last events and the body's terminator (sent by `_answer`): one write
        cork.cork()
    col = combined(cols)
    await conn.emit(out.last_events(finishes, col.usage(), spec_object(d, up.pool, col)))


def _served(g: Gateway, ex: Exchange, up: Upstream, col: Collected, status: int) -> None:
    d = ex.decision
    assert d is not None
    g.metrics.requests_by(d.domain, up.pool, str(status)).inc()
    ex.status = status
    ex.served = Served(up.pool, served_reason(d, up.pool), col.prompt_tokens, col.completion_tokens or col.num_tokens,
                       col.mean_accepted_length() if col.stats is not None else None)
    if status == 200 and g.settings.gateway_feedback:
        g.feedback(gateway_record(d, up.pool, col, up.worker_s, ex.rid or ""))
    if status == 200 and g.settings.conversation_affinity:
        assert ex.request is not None
        remember_turn(g, ex.request, up, col.text, col.prompt_tokens - col.cached_tokens)   # what it prefilled


def _headers(g: Gateway, ex: Exchange, pool: str | None, overhead_s: float,
             worker: str | None = None) -> list[tuple[bytes, bytes]]:
    """The decision headers, the serving worker's id and whether a conversation stayed on it."""
    assert ex.decision is not None and ex.rid is not None
    out = decision_headers(ex.decision, pool, g.snapshot.policy.version, overhead_s, ex.rid)
    if worker is not None:
        out.append((b"x-specroute-worker", worker_id(worker).encode("latin-1")))
    if ex.conversation:
        out.append((b"x-specroute-conversation", ex.conversation))
    return out


def _error(exc: APIError, rid: str | None) -> _Reply:
    headers = [JSON_CONTENT_TYPE, *raw_headers(exc.headers)]
    if rid is not None and "x-request-id" not in exc.headers:
        headers.append((b"x-request-id", rid.encode("latin-1")))
    return _Reply(exc.status, headers, orjson.dumps(exc.body()))


def _worker_error(up: Upstream, exc: grpc.aio.AioRpcError) -> APIError:
    up.failed(exc)
    return from_grpc(exc.code(), exc.details())


def _stopped_by_shutdown() -> None:
    """Withdraw the cancellation the server sent this request's task when its drain deadline passed
    (the handler answers the client itself and then ends normally)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class ASGIEndpoint(Response):
    """Runs `serve` as the response of the FastAPI route: the same handler the app's fast path calls
    (router/app.py), for requests that reach the route through the framework."""

    def __init__(self, g: Gateway, api: Api) -> None:
        self.g, self.api = g, api
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve(self.g, self.api, scope, receive, send)
