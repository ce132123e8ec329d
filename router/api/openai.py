"""OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Handlers read the raw body (so malformed JSON and oversize bodies become OpenAI errors, not 422s
or 500s), validate with the pydantic models in router/schemas.py, classify, route (pure policy on
the local snapshot), and stream from the chosen worker.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import grpc
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from router.errors import ENDPOINT_FAILURES, APIError, from_grpc, validation_error
from router.feedback import FeedbackRecord
from router.gateway import Gateway, Upstream, messages_for_classifier
from router.policy import Decision
from router.schemas import ChatCompletionRequest, CompletionRequest
from router.sse import ClientDisconnected, SSEResponse, race_disconnect
from specroute.v1 import engine_pb2

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


def check_api_key(request: Request, keys: dict[str, str]) -> None:
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    ok = scheme.lower() == "bearer" and any(hmac.compare_digest(token, k) for k in keys.values())
    if not ok:
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise APIError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return data


def decision_headers(g: Gateway, d: Decision, pool: str | None, overhead_s: float, rid: str) -> dict[str, str]:
    return {
        "x-specroute-domain": d.domain,
        "x-specroute-pool": pool or "none",
        "x-specroute-reason": d.reason if pool == d.pool else "fallback",
        "x-specroute-policy-version": str(g.snapshot.policy.version),
        "x-specroute-overhead-ms": f"{overhead_s * 1000.0:.3f}",
        "x-request-id": rid,
    }


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
    g.metrics.requests.labels(d.domain, up.pool, status).inc()
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
        nxt = await up.read()
        chunk = None if nxt is grpc.aio.EOF else nxt
    return col


async def _serve(request: Request, kind: Kind) -> Any:
    t0 = time.perf_counter()
    g = gateway_of(request)
    s = g.settings
    check_api_key(request, s.api_keys)
    data = await read_json(request, s.max_body_bytes)
    body: ChatCompletionRequest | CompletionRequest
    try:
        body = ChatCompletionRequest.model_validate(data) if kind == "chat" else CompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
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

    pre_s = time.perf_counter() - t0
    try:
        up = await g.open(d, req, time.monotonic() + s.request_timeout_s)
    except APIError as exc:
        g.metrics.requests.labels(d.domain, d.pool, str(exc.status)).inc()
        exc.headers.update(decision_headers(g, d, d.pool, time.perf_counter() - t0, rid))
        raise
    g.metrics.ttft_seconds.labels(up.pool).observe(up.worker_s)
    created = int(time.time())
    reason = d.reason if up.pool == d.pool else "fallback"

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        headers = decision_headers(g, d, up.pool, pre_s, rid)
        g.metrics.overhead_seconds.observe(pre_s)
        return SSEResponse(_stream(g, up, d, kind, body.model, rid, created, include_usage, reason), headers)

    try:
        col = await race_disconnect(request.receive, _collect(up))
        finish = _finish(col.finish)
    except ClientDisconnected:
        up.close(False)
        g.metrics.requests.labels(d.domain, up.pool, "499").inc()
        return Response(status_code=499)
    except grpc.aio.AioRpcError as exc:
        up.close(False)
        err = _worker_error(up, exc)
        g.metrics.requests.labels(d.domain, up.pool, str(err.status)).inc()
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
    return Response(orjson.dumps(obj), media_type="application/json",
                    headers=decision_headers(g, d, up.pool, overhead, rid))


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def _stream(
    g: Gateway, up: Upstream, d: Decision, kind: Kind, model: str, rid: str, created: int,
    include_usage: bool, reason: str,
) -> AsyncIterator[bytes]:
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

    col = _Collected()
    col.ttft_s = up.worker_s
    status = "200"
    ok = False
    itl = g.metrics.itl_seconds.labels(up.pool)
    try:
        if chat:
            yield _sse(piece("", None, role=True))
        chunk = up.first
        while chunk is not None:
            col.add(chunk)
            if chunk.text:
                yield _sse(piece(chunk.text, None))
            t = time.perf_counter()
            nxt = await up.read()
            itl.observe(time.perf_counter() - t)
            chunk = None if nxt is grpc.aio.EOF else nxt
        finish = _finish(col.finish)
        spec = spec_object(d, up.pool, col.stats, reason)
        last = piece(None if chat else "", finish)
        if not include_usage:
            last["specroute"] = spec
        yield _sse(last)
        if include_usage:
            yield _sse({**base, "choices": [], "usage": col.usage(), "specroute": spec})
        yield b"data: [DONE]\n\n"
        ok = True
    except grpc.aio.AioRpcError as exc:
        err = _worker_error(up, exc)
        status = str(err.status)
        yield _sse(err.body())
    except APIError as err:
        status = str(err.status)
        yield _sse(err.body())
    except BaseException:
        status = "499"
        raise
    finally:
        up.close(ok)
        _record(g, up, d, col, status)


@router.post("/v1/chat/completions", openapi_extra=_body_doc(ChatCompletionRequest), responses=_ERRORS)
async def chat_completions(request: Request) -> Any:
    """OpenAI chat completions (streaming with `stream: true`)."""
    return await _serve(request, "chat")


@router.post("/v1/completions", openapi_extra=_body_doc(CompletionRequest), responses=_ERRORS)
async def completions(request: Request) -> Any:
    """OpenAI legacy text completions."""
    return await _serve(request, "completion")


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
