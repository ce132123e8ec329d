"""The handler of `/v1/chat/completions` and `/v1/completions`, as plain ASGI (`serve`): auth, body,
classify, route, the upstream call and the response, JSON or streamed.

These two endpoints are the hot path, so the app (router/app.py) calls `serve` directly for `POST`
on their paths, without the framework's routing, middleware stack, request and response objects
(together they cost more CPU per request than the gateway's own work); the FastAPI routes
(router/api/openai.py) run the same handler through `ASGIEndpoint`. What goes over the wire is built
by the pure functions of router/api/openai_wire.py; a non-streaming request asks the worker to
`coalesce` its chunks.

Per-request hooks live here, not in middleware (which these paths skip): `serve` fills an `Outcome`
as the request goes and writes the access log line (router/observability/access_log.py) once the response is out.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import orjson
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from router.api.common import authenticate, parse_json
from router.api.openai_wire import (
    SSE_HEADERS,
    Body,
    Collected,
    Completion,
    Kind,
    classifier_input,
    context_of,
    decision_headers,
    feedback_record,
    finish_reason,
    generate_request,
    served_reason,
    spec_object,
    sse,
)
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.gateway import Gateway
from router.http.asgi import (
    JSON_CONTENT_TYPE,
    ClientDisconnected,
    Cork,
    DisconnectGuard,
    Headers,
    cork_of,
    header_dict,
    raw_headers,
    read_body,
    send_response,
)
from router.http.errors import APIError, from_grpc, from_upstream, validation_error
from router.http.request_id import request_id
from router.observability.access_log import Outcome
from router.observability.tracing import RequestTrace
from router.routing.decide import Decision
from router.workers.upstream import Upstream, UpstreamError
from specroute.contracts.limits import prompt_byte_limit, text_bytes, too_long_message
from specroute.v1 import engine_pb2

log = logging.getLogger("specroute.gateway.api")


class _Reply:
    """A whole JSON response for `serve` to send."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Headers, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


_STREAMED = _Reply(200, [], b"")  # the SSE stream went out; only its terminator is left to send
_SHUTTING_DOWN = APIError(503, "the gateway is shutting down; retry the request", code="shutting_down")


async def serve(g: Gateway, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
    """The whole `/v1/chat/completions` (`kind="chat"`) or `/v1/completions` request, as ASGI.

    Every outcome is an OpenAI response: the completion (JSON, or SSE with `stream: true`), an
    OpenAI error with its status, or nothing when the client went away (its worker call cancelled).
    """
    t0 = time.perf_counter()
    out = Outcome(kind)
    if g.tracing is not None:
        out.trace = RequestTrace(g.tracing, "POST " + scope["path"], scope["headers"], time.time_ns())
    cork = cork_of(scope)
    try:
        await _serve(g, kind, scope, receive, send, t0, out, cork)
    finally:
        if cork is not None:
            cork.uncork()  # a stream's last events (or whatever an error left held) go out now
        if not out.status:
            out.status = 499  # the client went away (or the task was torn down) before an answer
        key = out.api_key
        if key is not None:
            g.metrics.key_requests_by(key.name, str(out.status)).inc()
            if key.limits.tpm is not None:
                g.keys.limiter.charge(key, out.prompt_tokens + out.completion_tokens)
        latency = time.perf_counter() - t0
        g.series.observe(out.domain, out.pool, out.status, out.completion_tokens, latency)
        if g.access_log is not None:
            g.access_log.write(out, latency)
        if out.trace is not None:
            out.trace.end(out, g.snapshot.policy.version)


async def _serve(g: Gateway, kind: Kind, scope: Scope, receive: Receive, send: Send, t0: float,
                 out: Outcome, cork: Cork | None) -> None:
    try:
        reply = await _complete(g, kind, scope, receive, send, t0, out, cork)
    except APIError as exc:
        headers = [JSON_CONTENT_TYPE, *raw_headers(exc.headers)]
        if out.rid is not None and "x-request-id" not in exc.headers:
            headers.append((b"x-request-id", out.rid.encode("latin-1")))
        reply = _Reply(exc.status, headers, orjson.dumps(exc.body()))
    except ClientDisconnected:
        return
    except asyncio.CancelledError:
        # not the client's doing (that ends quietly in `_complete`): the gateway is stopping and its
        # drain deadline passed. The request is over; the client gets an OpenAI error, not a cut.
        _stopped_by_shutdown()
        reply = _Reply(503, [JSON_CONTENT_TYPE, *raw_headers(_SHUTTING_DOWN.headers)],
                       orjson.dumps(_SHUTTING_DOWN.body()))
    except Exception as exc:  # a bug: a 500 in the OpenAI shape (the FastAPI handler does the same)
        log.exception("unexpected error in %s", scope.get("path"))
        err = APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
        reply = _Reply(500, [JSON_CONTENT_TYPE], orjson.dumps(err.body()))
    if reply is None:
        return
    if reply is _STREAMED:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    out.status = reply.status
    await send_response(send, reply.status, reply.headers, reply.body, cork)


def _parse(kind: Kind, raw: bytes) -> Body:
    data = parse_json(raw)
    try:
        if kind == "chat":
            return ChatCompletionRequest.model_validate(data)
        return CompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _stopped_by_shutdown() -> None:
    """Withdraw the cancellation the server sent this request's task when its drain deadline passed
    (the handler answers the client itself and then ends normally)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def check_prompt_size(body: Body, context_tokens: int, prompt_bytes: int | None = None) -> None:
    """Refuse a prompt that certainly cannot fit `context_tokens` by its byte size alone (the bound of
    specroute/contracts/limits.py), before it is classified or sent to a worker to tokenize;
    `prompt_bytes`: its size, when already counted."""
    limit = prompt_byte_limit(context_tokens)
    if limit <= 0:
        return
    n = text_bytes(body.prompt_texts()) if prompt_bytes is None else prompt_bytes
    if n > limit:
        raise APIError(400, too_long_message(n, context_tokens), param=body.prompt_param,
                       code="context_length_exceeded")


def _headers(g: Gateway, d: Decision, pool: str | None, overhead_s: float, rid: str) -> Headers:
    return decision_headers(d, pool, g.snapshot.policy.version, overhead_s, rid)


async def _complete(g: Gateway, kind: Kind, scope: Scope, receive: Receive, send: Send, t0: float,
                    out: Outcome, cork: Cork | None) -> _Reply | None:
    s = g.settings
    authorization = b""
    content_length: bytes | None = None
    client_rid: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            content_length = value
        elif name == b"authorization":
            authorization = value
        elif name == b"x-request-id":
            client_rid = value
    out.rid = rid = request_id(client_rid)
    key = out.api_key = authenticate(g, authorization.decode("latin-1"))
    if key is not None:
        out.key = key.name
        if key.limited:  # the one Redis round trip on the request path, only for keys with a limit
            verdict = await g.keys.limiter.admit(key)
            if not verdict.admitted:
                raise APIError(429, f"Rate limit reached for key {key.name!r}: {verdict.limit} "
                                    f"(retry in {verdict.retry_after_s} s).", code="rate_limit_exceeded",
                               headers={"retry-after": str(verdict.retry_after_s)})
    body = _parse(kind, await read_body(receive, s.max_body_bytes, content_length))
    out.model, out.stream = body.model, bool(body.stream)
    body.check_supported()
    if not g.model_known(body.model):
        raise APIError(404, f"The model `{body.model}` does not exist.", param="model", code="model_not_found")
    texts = body.prompt_texts()
    prompt_bytes = text_bytes(texts)
    check_prompt_size(body, g.pools.largest_context(), prompt_bytes)  # what fits no pool is not even classified

    tr = out.trace if out.trace is not None and out.trace.recording else None  # spans to build
    t_cls = time.time_ns() if tr is not None else 0
    label, probs, unc = g.classify(classifier_input(body))
    if not probs and label:
        probs = {label: 1.0}
    allowed = key.limits.pools if key is not None else ()
    t_dec = time.time_ns() if tr is not None else 0
    d = g.route(probs, unc, allowed, context_of(body, texts, prompt_bytes))
    if tr is not None:
        tr.phase("classify", t_cls, t_dec, {"specroute.domain": d.domain, "specroute.uncertainty": unc})
        tr.phase("decide", t_dec, time.time_ns(), {"specroute.pool": d.pool, "specroute.reason": d.reason})
    out.domain, out.pool, out.reason = d.domain, d.pool, d.reason
    if key is not None and key.limits.domains and d.domain not in key.limits.domains:
        raise APIError(403, f"API key {key.name!r} may not be used for {d.domain!r} requests.",
                       code="domain_not_allowed")
    if d.pool is None:
        raise APIError(503, "no healthy worker pool can serve this request", code="no_healthy_pool",
                       headers=header_dict(_headers(g, d, None, time.perf_counter() - t0, rid)))
    max_tokens = body.effective_max_tokens()
    mc = g.pools.max_context(d.pool)
    if mc and max_tokens is not None and max_tokens >= mc:
        raise APIError(400, f"max_tokens={max_tokens} does not fit the model's context of {mc} tokens",
                       param="max_tokens", code="context_length_exceeded")
    check_prompt_size(body, mc, prompt_bytes)

    req = generate_request(body, rid, d.domain, d.context)
    guard = DisconnectGuard(receive)
    try:
        return await _generate(g, kind, body, d, req, t0, send, guard, out, cork)
    except asyncio.CancelledError:
        if guard.caused_cancel():
            return None
        raise
    finally:
        guard.close()


async def _generate(
    g: Gateway, kind: Kind, body: Body, d: Decision, req: engine_pb2.GenerateRequest, t0: float, send: Send,
    guard: DisconnectGuard, log_out: Outcome, cork: Cork | None = None,
) -> _Reply:
    pre_s = time.perf_counter() - t0
    assert d.pool is not None
    rid = req.request_id
    try:
        allowed = log_out.api_key.limits.pools if log_out.api_key is not None else ()
        tr = log_out.trace
        metadata = tr.upstream(time.time_ns(), d.pool) if tr is not None else None
        up = await g.open(d, req, time.monotonic() + g.settings.request_timeout_s, allowed, metadata)
    except UpstreamError as exc:
        err = from_upstream(exc)
        if err.code == "context_length_exceeded" and err.param is None:
            err.param = body.prompt_param
        g.metrics.requests_by(d.domain, d.pool, str(err.status)).inc()
        err.headers.update(header_dict(_headers(g, d, d.pool, time.perf_counter() - t0, rid)))
        raise err from exc
    except asyncio.CancelledError:
        g.metrics.requests_by(d.domain, d.pool, "499").inc()
        raise
    g.metrics.ttft_by(up.pool).observe(up.worker_s)
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    out = Completion(kind, rid, int(time.time()), body.model, include_usage)

    if body.stream:
        g.metrics.overhead_seconds.observe(pre_s)
        headers = [*SSE_HEADERS, *_headers(g, d, up.pool, pre_s, rid)]
        if cork is not None:  # the head, the role event and the first token: one write
            cork.cork()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _stream(g, up, d, out, send, guard, log_out, cork)
        return _STREAMED

    col = Collected(up.worker_s)
    try:
        async for chunk in up.chunks():
            col.add(chunk)
        finish = finish_reason(col.finish)
    except asyncio.CancelledError:
        up.close(False)
        g.metrics.requests_by(d.domain, up.pool, "499").inc()
        raise
    except grpc.aio.AioRpcError as exc:
        up.close(False)
        err = _worker_error(up, exc)
        g.metrics.requests_by(d.domain, up.pool, str(err.status)).inc()
        raise err from None
    except APIError:
        up.close(False)
        raise
    up.close(True)
    spec = spec_object(d, up.pool, col)
    overhead = max(0.0, time.perf_counter() - t0 - up.worker_s)
    g.metrics.overhead_seconds.observe(overhead)
    _record(g, up, d, col, "200", rid, log_out)
    return _Reply(200, [JSON_CONTENT_TYPE, *_headers(g, d, up.pool, overhead, rid)],
                  out.json("".join(col.text), finish, col.usage(), spec))


def _record(g: Gateway, up: Upstream, d: Decision, col: Collected, status: str, rid: str, out: Outcome) -> None:
    g.metrics.requests_by(d.domain, up.pool, status).inc()
    out.pool, out.reason, out.status = up.pool, served_reason(d, up.pool), int(status)
    out.prompt_tokens, out.completion_tokens = col.prompt_tokens, col.completion_tokens or col.num_tokens
    if col.stats is not None:
        out.mal = col.mean_accepted_length()
    if g.settings.gateway_feedback and status == "200":
        g.feedback(feedback_record(d, up.pool, col, up.worker_s, rid))


def _worker_error(up: Upstream, exc: grpc.aio.AioRpcError) -> APIError:
    up.failed(exc)
    return from_grpc(exc.code(), exc.details())


async def _stream(g: Gateway, up: Upstream, d: Decision, out: Completion, send: Send,
                  guard: DisconnectGuard, log_out: Outcome, cork: Cork | None = None) -> None:
    """Send the SSE events of one streamed completion (all but the body's terminator). Every way it
    can end is seen by the client: `[DONE]`, or an OpenAI error event (the worker failed, or the
    gateway is stopping), or nothing because the client itself went away."""

    async def emit(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    col = Collected(up.worker_s)
    status = "200"
    ok = False
    try:
        if out.kind == "chat":
            await emit(out.role_event())
        async for chunk in up.chunks(g.metrics.itl_by(up.pool).observe):
            col.add(chunk)
            if chunk.text:
                await emit(out.token_event(chunk.text))
            if cork is not None and not chunk.finish_reason:
                cork.uncork()
        finish = finish_reason(col.finish)
        if cork is not None:  # the last events and the body's terminator (sent by `_serve`): one write
            cork.cork()
        await emit(out.last_events(finish, col.usage(), spec_object(d, up.pool, col)))
        ok = True
    except grpc.aio.AioRpcError as exc:
        err = _worker_error(up, exc)
        status = str(err.status)
        await emit(sse(err.body()))
    except APIError as err:
        status = str(err.status)
        await emit(sse(err.body()))
    except Exception as exc:  # a bug: end the stream with an OpenAI error event
        log.exception("unexpected error while streaming")
        status = "500"
        await emit(sse(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").body()))
    except asyncio.CancelledError:
        if guard.disconnected:
            status = "499"
            raise
        status = "503"  # the gateway is stopping and its drain deadline passed: end the stream cleanly
        _stopped_by_shutdown()
        await emit(sse(_SHUTTING_DOWN.body()))
    except BaseException:
        status = "499"
        raise
    finally:
        up.close(ok)
        _record(g, up, d, col, status, out.rid, log_out)


class ASGIEndpoint(Response):
    """Runs `serve` as the response of the FastAPI route: the same handler the app's fast path calls
    (router/app.py), for requests that reach the route through the framework."""

    def __init__(self, g: Gateway, kind: Kind) -> None:
        self.g, self.kind = g, kind
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve(self.g, self.kind, scope, receive, send)
