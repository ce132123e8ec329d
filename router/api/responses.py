"""`POST /v1/responses` and `GET /v1/responses/{id}`: the Responses API, served by the chat completions
handler (router/api/completions.py `serve`).

A request is authenticated, parsed and checked here (router/api/responses_wire.py), its
`previous_response_id` looked up (router/state/responses.py), and the chat completions body that
answers it runs through `serve` exactly like a client's own (key limits, routing, workers, retries,
logs, metrics); `Bridge` turns what `serve` sends into the Responses shape: the whole Response
object, or the Responses stream events, and an error as it is (same status, OpenAI's error body). A
stored response (`store`, the default) keeps the conversation so far for a follow-up; it is stored
before the client sees it finished.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from router.api.common import authenticate, gateway_of, parse_json
from router.api.completions import serve
from router.api.responses_wire import (
    ResponseEvents,
    ResponsesRequest,
    chat_body,
    conversation,
    from_chat,
    new_ids,
)
from router.gateway import Gateway
from router.http.asgi import JSON_CONTENT_TYPE, ClientDisconnected, raw_headers, read_body, send_response
from router.http.errors import APIError, validation_error
from router.keys.ring import ApiKey
from router.state.store import StoreUnavailable

log = logging.getLogger("specroute.gateway.responses")
router = APIRouter(tags=["openai"])


_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/ResponsesRequest"}}}}}


@router.post("/v1/responses", openapi_extra=_BODY)
async def create_response(request: Request) -> Response:
    """OpenAI Responses (text in and out; streaming with `stream: true`; `previous_response_id`)."""
    return ResponsesEndpoint(gateway_of(request))


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    g = gateway_of(request)
    key = authenticate(g, request.headers.get("authorization", ""))
    rec = await _stored(g, response_id, "response_id", key)
    return Response(orjson.dumps(rec["response"]), media_type="application/json")


class ResponsesEndpoint(Response):
    def __init__(self, g: Gateway) -> None:
        self.g = g
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve_responses(self.g, scope, receive, send)


async def serve_responses(g: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """The whole `/v1/responses` request, as ASGI."""
    try:
        req, history, key = await _admit(g, scope, receive)
    except APIError as exc:
        await send_response(send, exc.status, [JSON_CONTENT_TYPE, *raw_headers(exc.headers)], orjson.dumps(exc.body()))
        return
    except ClientDisconnected:
        return
    body = orjson.dumps(chat_body(req, history))
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
    inner = {**scope, "headers": [*headers, (b"content-length", b"%d" % len(body))]}
    given = False

    async def inner_receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    bridge = Bridge(g, req, history, send, owner_of(key))
    await serve(g, "chat", inner, inner_receive, bridge.send)


async def _admit(g: Gateway, scope: Scope, receive: Receive
                 ) -> tuple[ResponsesRequest, list[dict[str, str]], ApiKey | None]:
    """The parsed and checked request, the stored conversation it continues and the client's key."""
    hdrs = dict(scope["headers"])
    key = authenticate(g, hdrs.get(b"authorization", b"").decode("latin-1"))
    raw = await read_body(receive, g.settings.max_body_bytes, hdrs.get(b"content-length"))
    try:
        req = ResponsesRequest.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] in ("json_invalid", "model_type") and not e["loc"] for e in exc.errors()):
            parse_json(raw)
        raise validation_error(exc.errors()) from None
    req.check_supported()
    history: list[dict[str, str]] = []
    if req.previous_response_id is not None:
        history = (await _stored(g, req.previous_response_id, "previous_response_id", key))["messages"]
    return req, history, key


def owner_of(key: ApiKey | None) -> str:
    """Whose a stored response is: the key's name ("" on a gateway that needs no key)."""
    return key.name if key is not None else ""


async def _stored(g: Gateway, response_id: str, param: str, key: ApiKey | None) -> dict[str, Any]:
    """The stored response `response_id` of the caller's own key; another key's is not found, as an
    unknown one is (a 404 says nothing about what others stored)."""
    try:
        rec = await g.responses.get(response_id)
    except StoreUnavailable as exc:
        raise APIError(503, "the response store is unavailable; retry the request", code="store_unavailable") from exc
    if rec is None or rec.get("owner", "") != owner_of(key):
        raise APIError(404, f"Response with id '{response_id}' not found.", param=param,
                       code="previous_response_not_found" if param == "previous_response_id" else "not_found")
    return rec


class Bridge:
    """The `send` that `serve` writes the chat completion to: what reaches the client is the Responses
    shape (errors pass as they are)."""

    def __init__(self, g: Gateway, req: ResponsesRequest, history: list[dict[str, str]], send: Send,
                 owner: str) -> None:
        self.g, self.req, self.history, self.out, self.owner = g, req, history, send, owner
        self.start: Message | None = None
        self.body = bytearray()
        self.ids = new_ids()
        self.events = ResponseEvents(req, self.ids) if req.stream else None

    @property
    def streaming(self) -> bool:
        return self.events is not None and self.start is not None and self.start["status"] == 200

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            if self.streaming:
                await self.out(message)
            return
        if message["type"] != "http.response.body":
            await self.out(message)
            return
        if self.streaming:
            await self._stream(message)
            return
        self.body += message.get("body", b"")
        if not message.get("more_body", False):
            await self._whole()

    async def _stream(self, message: Message) -> None:
        assert self.events is not None
        out = b""
        for event in bytes(message.get("body", b"")).split(b"\n\n"):
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            data = orjson.loads(event[6:])
            if "error" in data:
                out += self.events.on_error(data)
                continue
            piece = self.events.on_chat(data)
            if self.events.done is not None and data.get("usage") is not None:
                await self._store(self.events.done, "".join(self.events.text))
            out += piece
        if out or not message.get("more_body", False):
            await self.out({"type": "http.response.body", "body": out, "more_body": message.get("more_body", False)})

    async def _whole(self) -> None:
        assert self.start is not None
        status, headers, body = self.start["status"], list(self.start.get("headers", [])), bytes(self.body)
        if status == 200:
            chat = orjson.loads(body)
            resp = from_chat(self.req, chat, self.ids)
            await self._store(resp, chat["choices"][0]["message"]["content"] or "")
            body = orjson.dumps(resp)
        headers = [(k, v) for k, v in headers if k != b"content-length"] + [(b"content-length", b"%d" % len(body))]
        await self.out({"type": "http.response.start", "status": status, "headers": headers})
        await self.out({"type": "http.response.body", "body": body, "more_body": False})

    async def _store(self, resp: dict[str, Any], answer: str) -> None:
        if self.req.store is False:
            return
        try:
            await self.g.responses.put(resp["id"], {"response": resp, "owner": self.owner,
                                                    "messages": conversation(self.req, self.history, answer)})
        except StoreUnavailable:
            log.warning("response %s not stored: the response store is unavailable", resp["id"])
