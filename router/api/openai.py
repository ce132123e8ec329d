"""OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Handlers read the raw body (so malformed JSON and oversize bodies become OpenAI errors, not 422s
or 500s), validate with the pydantic models in router/schemas.py, classify, route (pure policy on
the local snapshot), and stream from the chosen worker.

The two completion endpoints are the hot path, so they are one plain ASGI handler, `serve`: the app
(router/app.py) calls it directly for `POST` on `FAST_PATHS`, without the framework's routing,
middleware stack, request and response objects (together they cost more CPU per request than the
gateway's own work), and the FastAPI routes below run the same handler for requests that do go
through the framework; they also describe the endpoints in the OpenAPI document. Responses are built
as bytes with orjson; a non-streaming request asks the worker to `coalesce` its chunks.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Literal

import grpc
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from router.asgi import (
    JSON_CONTENT_TYPE,
    ClientDisconnected,
    DisconnectGuard,
    Headers,
    read_body,
    send_response,
)
from router.errors import ENDPOINT_FAILURES, APIError, from_grpc, validation_error
from router.feedback import FeedbackRecord
from router.gateway import Gateway, Upstream, messages_for_classifier
from router.policy import Decision
from router.schemas import ChatCompletionRequest, CompletionRequest
from specroute.v1 import engine_pb2

log = logging.getLogger("specroute.gateway.api")
router = APIRouter(tags=["openai"])

Kind = Literal["chat", "completion"]
_FINISH = {"stop": "stop", "length": "length", "": "stop"}
_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ERRORS = {
    str(s): {"description": d, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for s, d in [(400, "invalid request"), (401, "bad API key"), (404, "unknown model"),
                 (413, "body too large"), (429, "workers overloaded"), (503, "no healthy worker")]
}


def _body_doc(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway  # type: ignore[no-any-return]


def check_authorization(header: str, keys: dict[str, str]) -> None:
    """`header` (the Authorization value) must carry one of `keys` as a bearer token (if any are set)."""
    if not keys:
        return
    scheme, _, token = header.partition(" ")
    token = token.strip()
    ok = scheme.lower() == "bearer" and any(hmac.compare_digest(token, k) for k in keys.values())
    if not ok:
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")


def check_api_key(request: Request, keys: dict[str, str]) -> None:
    check_authorization(request.headers.get("authorization", ""), keys)


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return data


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    try:
        body = await read_body(request.receive, limit, request.headers.get("content-length", "").encode() or None)
    except ClientDisconnected:
        raise ClientDisconnect() from None
    return parse_json(body)


def raw_headers(headers: Mapping[str, str]) -> Headers:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def decision_headers(g: Gateway, d: Decision, pool: str | None, overhead_s: float, rid: str) -> dict[str, str]:
    return {
        "x-specroute-domain": d.domain,
        "x-specroute-pool": pool or "none",
        "x-specroute-reason": d.reason if pool == d.pool else "fallback",
        "x-specroute-policy-version": str(g.snapshot.policy.version),
        "x-specroute-overhead-ms": f"{overhead_s * 1000.0:.3f}",
        "x-request-id": rid,
    }


def raw_decision_headers(g: Gateway, d: Decision, pool: str, overhead_s: float, rid: str) -> Headers:
    """`decision_headers` as ASGI header pairs (for a worker-served request, `pool` set)."""
    return [
        (b"x-specroute-domain", d.domain.encode("latin-1")),
        (b"x-specroute-pool", pool.encode("latin-1")),
        (b"x-specroute-reason", (d.reason if pool == d.pool else "fallback").encode("latin-1")),
        (b"x-specroute-policy-version", b"%d" % g.snapshot.policy.version),
        (b"x-specroute-overhead-ms", b"%.3f" % (overhead_s * 1000.0)),
        (b"x-request-id", rid.encode("latin-1")),
    ]


def spec_object(d: Decision, pool: str, stats: Any, reason: str) -> dict[str, Any]:
    drafted = int(stats.drafted_tokens) if stats is not None else 0
    accepted = int(stats.accepted_tokens) if stats is not None else 0
    steps = int(stats.steps) if stats is not None else 0
    mal = float(stats.mean_accepted_length) if stats is not None and stats.mean_accepted_length else (
        1.0 + accepted / steps if steps else None
    )
    return {
        "domain": d.domain,
        "pool": pool,
        "reason": reason,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "steps": steps,
        "mean_accepted_length": mal,
    }


def _finish(reason: str) -> str:
    if reason in ("error", "cancelled"):
        raise APIError(502, f"worker ended the request with {reason!r}", code="worker_error")
    return _FINISH.get(reason, reason)


class _Collected:
    __slots__ = ("text", "finish", "prompt_tokens", "completion_tokens", "num_tokens", "stats", "ttft_s")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.finish = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.num_tokens = 0
        self.stats: Any = None
        self.ttft_s = 0.0

    def add(self, c: Any) -> None:
        if c.text:
            self.text.append(c.text)
        self.num_tokens += c.num_tokens
        if c.prompt_tokens:
            self.prompt_tokens = c.prompt_tokens
        if c.finish_reason:
            self.finish = c.finish_reason
            self.completion_tokens = c.completion_tokens or self.num_tokens
            if c.HasField("stats"):
                self.stats = c.stats

    def usage(self) -> dict[str, int]:
        ct = self.completion_tokens or self.num_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": ct,
                "total_tokens": self.prompt_tokens + ct}


def _record(g: Gateway, up: Upstream, d: Decision, col: _Collected, status: str) -> None:
    g.metrics.requests_by(d.domain, up.pool, status).inc()
    if g.settings.gateway_feedback and status == "200":
        s = col.stats
        g.feedback(FeedbackRecord(
            pool=up.pool, domain=d.domain, tokens=col.completion_tokens or col.num_tokens,
            drafted=int(s.drafted_tokens) if s is not None else 0,
            accepted=int(s.accepted_tokens) if s is not None else 0,
            steps=int(s.steps) if s is not None else 0,
            wall_ms=up.worker_s * 1000.0, ttft_ms=col.ttft_s * 1000.0, engine="gateway",
        ))


def _worker_error(up: Upstream, exc: grpc.aio.AioRpcError) -> APIError:
    code = exc.code()
    if code in ENDPOINT_FAILURES:
        up.endpoint.record_failure(exc.details() or code.name, connection=code == grpc.StatusCode.UNAVAILABLE)
    return from_grpc(code, exc.details())


async def _collect(up: Upstream) -> _Collected:
    col = _Collected()
    col.ttft_s = up.worker_s
    chunk = up.first
    while chunk is not None:
        col.add(chunk)
        if chunk.finish_reason:
            await up.finish()
            break
        nxt = await up.read()
        chunk = None if nxt is grpc.aio.EOF else nxt
    return col


def _parse(kind: Kind, raw: bytes) -> ChatCompletionRequest | CompletionRequest:
    data = parse_json(raw)
    try:
        if kind == "chat":
            return ChatCompletionRequest.model_validate(data)
        return CompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


class _Reply:
    """A whole JSON response for `serve` to send."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Headers, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


_STREAMED = _Reply(200, [], b"")  # the SSE stream went out; only its terminator is left to send


async def serve(g: Gateway, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
    """The whole `/v1/chat/completions` (`kind="chat"`) or `/v1/completions` request, as ASGI.

    Every outcome is an OpenAI response: the completion (JSON, or SSE with `stream: true`), an
    OpenAI error with its status, or nothing when the client went away (its worker call cancelled).
    """
    t0 = time.perf_counter()
    try:
        reply = await _complete(g, kind, scope, receive, send, t0)
    except APIError as exc:
        reply = _Reply(exc.status, [JSON_CONTENT_TYPE, *raw_headers(exc.headers)], orjson.dumps(exc.body()))
    except ClientDisconnected:
        return
    except Exception as exc:  # a bug: a 500 in the OpenAI shape (the FastAPI handler does the same)
        log.exception("unexpected error in %s", scope.get("path"))
        err = APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
        reply = _Reply(500, [JSON_CONTENT_TYPE], orjson.dumps(err.body()))
    if reply is None:
        return
    if reply is _STREAMED:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send_response(send, reply.status, reply.headers, reply.body)


async def _complete(g: Gateway, kind: Kind, scope: Scope, receive: Receive, send: Send, t0: float) -> _Reply | None:
    s = g.settings
    authorization = b""
    content_length: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            content_length = value
        elif name == b"authorization":
            authorization = value
    if s.api_keys:
        check_authorization(authorization.decode("latin-1"), s.api_keys)
    body = _parse(kind, await read_body(receive, s.max_body_bytes, content_length))
    body.check_supported()
    if not g.model_known(body.model):
        raise APIError(404, f"The model `{body.model}` does not exist.", param="model", code="model_not_found")

    req = engine_pb2.GenerateRequest()
    if isinstance(body, ChatCompletionRequest):
        pairs = body.wire_messages()
        for role, content in pairs:
            req.messages.add(role=role, content=content)
        cls_input = messages_for_classifier(pairs)
    else:
        req.prompt = body.prompt_text()
        cls_input = [{"role": "user", "content": req.prompt}]
    label, probs, unc = g.classify(cls_input)
    if not probs and label:
        probs = {label: 1.0}
    d = g.route(probs, unc)
    rid = os.urandom(12).hex()
    max_tokens = body.effective_max_tokens()
    if d.pool is None:
        raise APIError(503, "no healthy worker pool can serve this request", code="no_healthy_pool",
                       headers=decision_headers(g, d, None, time.perf_counter() - t0, rid))
    mc = g.pools.max_context(d.pool)
    if mc and max_tokens is not None and max_tokens >= mc:
        raise APIError(400, f"max_tokens={max_tokens} does not fit the model's context of {mc} tokens",
                       param="max_tokens", code="context_length_exceeded")

    req.request_id = rid
    req.domain = d.domain
    sp = req.sampling
    sp.temperature = 1.0 if body.temperature is None else body.temperature
    sp.top_p = 1.0 if body.top_p is None else body.top_p
    if body.seed is not None:
        sp.has_seed = True
        sp.seed = body.seed
    req.max_tokens = max_tokens or 0
    req.stop.extend(body.stop_list())
    # a non-streaming answer is only read whole: the worker sends the first chunk (time to first
    # token, retries before it) and then one final chunk, instead of one gRPC message per delta
    req.coalesce = not body.stream

    guard = DisconnectGuard(receive)
    try:
        return await _generate(g, kind, body, d, req, rid, t0, send)
    except asyncio.CancelledError:
        if guard.caused_cancel():
            return None
        raise
    finally:
        guard.close()


async def _generate(
    g: Gateway, kind: Kind, body: ChatCompletionRequest | CompletionRequest, d: Decision,
    req: engine_pb2.GenerateRequest, rid: str, t0: float, send: Send,
) -> _Reply:
    pre_s = time.perf_counter() - t0
    assert d.pool is not None
    try:
        up = await g.open(d, req, time.monotonic() + g.settings.request_timeout_s)
    except APIError as exc:
        g.metrics.requests_by(d.domain, d.pool, str(exc.status)).inc()
        exc.headers.update(decision_headers(g, d, d.pool, time.perf_counter() - t0, rid))
        raise
    except asyncio.CancelledError:
        g.metrics.requests_by(d.domain, d.pool, "499").inc()
        raise
    g.metrics.ttft_by(up.pool).observe(up.worker_s)
    created = int(time.time())
    reason = d.reason if up.pool == d.pool else "fallback"

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        g.metrics.overhead_seconds.observe(pre_s)
        headers = [*_SSE_HEADERS, *raw_decision_headers(g, d, up.pool, pre_s, rid)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _stream(g, up, d, kind, body.model, rid, created, include_usage, reason, send)
        return _STREAMED

    try:
        col = await _collect(up)
        finish = _finish(col.finish)
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
    text = "".join(col.text)
    if kind == "chat":
        obj: dict[str, Any] = {
            "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": body.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
        }
    else:
        obj = {
            "id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": body.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }
    obj["usage"] = col.usage()
    obj["specroute"] = spec_object(d, up.pool, col.stats, reason)
    overhead = max(0.0, time.perf_counter() - t0 - up.worker_s)
    g.metrics.overhead_seconds.observe(overhead)
    _record(g, up, d, col, "200")
    return _Reply(200, [JSON_CONTENT_TYPE, *raw_decision_headers(g, d, up.pool, overhead, rid)], orjson.dumps(obj))


_SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _stream(
    g: Gateway, up: Upstream, d: Decision, kind: Kind, model: str, rid: str, created: int,
    include_usage: bool, reason: str, send: Send,
) -> None:
    """Send the SSE events of one streamed completion (all but the body's terminator)."""
    chat = kind == "chat"
    base: dict[str, Any] = {
        "id": f"chatcmpl-{rid}" if chat else f"cmpl-{rid}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
    }
    if include_usage:
        base["usage"] = None

    def piece(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**base, "choices": [choice]}

    # the per-token event is `piece(text, None)` serialized: its fixed parts are encoded once
    head = b"data: " + orjson.dumps(base)[:-1] + (
        b',"choices":[{"index":0,"delta":{"content":' if chat else b',"choices":[{"index":0,"text":'
    )
    tail = (b'},' if chat else b',') + b'"logprobs":null,"finish_reason":null}]}\n\n'

    async def emit(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    col = _Collected()
    col.ttft_s = up.worker_s
    status = "200"
    ok = False
    itl = g.metrics.itl_by(up.pool)
    perf = time.perf_counter
    try:
        if chat:
            await emit(_sse(piece("", None, role=True)))
        chunk = up.first
        while chunk is not None:
            col.add(chunk)
            if chunk.text:
                await emit(head + orjson.dumps(chunk.text) + tail)
            if chunk.finish_reason:
                await up.finish()
                break
            t = perf()
            nxt = await up.read()
            itl.observe(perf() - t)
            chunk = None if nxt is grpc.aio.EOF else nxt
        finish = _finish(col.finish)
        spec = spec_object(d, up.pool, col.stats, reason)
        last = piece(None if chat else "", finish)
        if not include_usage:
            last["specroute"] = spec
        events = _sse(last)
        if include_usage:
            events += _sse({**base, "choices": [], "usage": col.usage(), "specroute": spec})
        await emit(events + b"data: [DONE]\n\n")
        ok = True
    except grpc.aio.AioRpcError as exc:
        err = _worker_error(up, exc)
        status = str(err.status)
        await emit(_sse(err.body()))
    except APIError as err:
        status = str(err.status)
        await emit(_sse(err.body()))
    except Exception as exc:  # a bug: end the stream with an OpenAI error event
        log.exception("unexpected error while streaming")
        status = "500"
        await emit(_sse(APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").body()))
    except BaseException:
        status = "499"
        raise
    finally:
        up.close(ok)
        _record(g, up, d, col, status)


class ASGIEndpoint(Response):
    """Runs `serve` as the response of the FastAPI route: the same handler the app's fast path calls
    (router/app.py), for requests that reach the route through the framework."""

    def __init__(self, g: Gateway, kind: Kind) -> None:
        self.g, self.kind = g, kind
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve(self.g, self.kind, scope, receive, send)


@router.post("/v1/chat/completions", openapi_extra=_body_doc(ChatCompletionRequest), responses=_ERRORS)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions (streaming with `stream: true`)."""
    return ASGIEndpoint(gateway_of(request), "chat")


@router.post("/v1/completions", openapi_extra=_body_doc(CompletionRequest), responses=_ERRORS)
async def completions(request: Request) -> Response:
    """OpenAI legacy text completions."""
    return ASGIEndpoint(gateway_of(request), "completion")


# what the app serves without the framework (router/app.py): POST path -> kind
FAST_PATHS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


@router.get("/v1/models", responses={"401": _ERRORS["401"]})
async def models(request: Request) -> Response:
    g = gateway_of(request)
    check_api_key(request, g.settings.api_keys)
    created = int(g.started_at)
    data = [{"id": m, "object": "model", "created": created, "owned_by": "specroute"} for m in g.served_models()]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


@router.get("/v1/models/{model_id:path}", responses={"404": _ERRORS["404"]})
async def model(request: Request, model_id: str) -> Response:
    g = gateway_of(request)
    check_api_key(request, g.settings.api_keys)
    if model_id not in g.served_models():
        raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
    obj = {"id": model_id, "object": "model", "created": int(g.started_at), "owned_by": "specroute"}
    return Response(orjson.dumps(obj), media_type="application/json")
