"""Admission: the checks one completion request passes before it is routed, and the typed request
that comes out of them (`Admitted`).

In order: the request id (the client's `x-request-id`, sanitised, or a fresh one), the API key and
its rate limit, the bounded body parsed into the OpenAI schema (router/api/schemas.py), the
unsupported parameters, the model name, and the prompt's byte size against the largest context any
worker has (specroute/contracts/limits.py: what fits no pool is not even classified). Everything the
later steps read is computed here once: the prompt texts and their size, and the request's
`RequestContext` (script, temperature bucket, size, output constraint; batch kind).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from starlette.types import Receive, Scope

from router.api.common import authenticate, parse_json
from router.api.openai_wire import Api, Body
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.api.structured import constraint
from router.gateway import Gateway
from router.http.asgi import read_body
from router.http.errors import APIError, validation_error
from router.keys.ratelimit import ADMITTED, Verdict
from router.keys.ring import ApiKey
from router.routing.conversation import conversation_key, history_chars
from router.routing.features import prompt_features
from specroute.contracts.context import RequestContext, request_context
from specroute.contracts.limits import prompt_byte_limit, text_bytes, too_long_message

_SCHEMAS: dict[str, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "chat": ChatCompletionRequest, "completion": CompletionRequest}


@dataclass(frozen=True, slots=True)
class Admitted:
    """One admitted completion request: who sent it, what it asks, and its routing context."""

    api: Api                        # which endpoint: chat or (legacy) completions
    rid: str                        # request id: response header, completion id, worker, logs
    key: ApiKey | None              # the client's API key (None: the gateway needs none)
    body: Body
    texts: tuple[str, ...]          # the prompt's texts (chat messages, or the prompt)
    prompt_bytes: int               # their UTF-8 size
    context: RequestContext         # script, temperature, size, constraint (the domain comes with routing)
    conversation: tuple[str, str] | None = None  # (source, key) of the conversation it continues
    history_chars: int = 0          # characters of the history a worker prefills (all but the new message)
    features: tuple[float, ...] = ()  # the prompt part of its features (router/routing/features.py)

    @property
    def stream(self) -> bool:
        return bool(self.body.stream)

    @property
    def pools(self) -> tuple[str, ...]:
        """The pools the key may use (empty: all)."""
        return tuple(self.key.limits.pools) if self.key is not None else ()


class Headers:
    """The request headers admission reads, found in one pass."""

    __slots__ = ("authorization", "content_length", "request_id", "conversation")

    def __init__(self, scope: Scope, conversation_header: bytes = b"x-conversation-id") -> None:
        self.authorization, self.content_length, self.request_id = b"", None, None
        self.conversation: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                self.content_length = value
            elif name == b"authorization":
                self.authorization = value
            elif name == b"x-request-id":
                self.request_id = value
            elif name == conversation_header:
                self.conversation = value


def client_key(g: Gateway, headers: Headers) -> ApiKey | None:
    """The client's API key (None when the gateway needs none; 401 for a missing or wrong one)."""
    return authenticate(g, headers.authorization.decode("latin-1"))


def reserve_tokens(req: Admitted, context_tokens: int) -> int:
    """The tokens a request may cost, reserved against its key's tpm at admission: the prompt's
    estimate (a token per 4 bytes) plus `max_tokens` (unset: the largest context) for each choice."""
    return (req.prompt_bytes + 3) // 4 + (req.body.effective_max_tokens() or context_tokens) * req.body.choices()


async def within_limits(g: Gateway, req: Admitted, context_tokens: int) -> Verdict:
    """The key's verdict (tokens reserved); 429 when the key is over its rate limit."""
    key = req.key
    if key is not None and key.limited:  # the one Redis round trip on the request path, only for limited keys
        verdict = await g.keys.limiter.admit(key, reserve_tokens(req, context_tokens))
        if not verdict.admitted:
            raise APIError(429, f"Rate limit reached for key {key.name!r}: {verdict.limit} "
                                f"(retry in {verdict.retry_after_s} s).", code="rate_limit_exceeded",
                           headers={"retry-after": str(verdict.retry_after_s)})
        return verdict
    return ADMITTED


async def admit(g: Gateway, headers: Headers, receive: Receive, *, api: Api, rid: str,
                key: ApiKey | None) -> Admitted:
    """The admitted request of an authorized client, or an `APIError` saying why not (400, 404, 413)."""
    body = parse_body(api, await read_body(receive, g.settings.max_body_bytes, headers.content_length))
    body.check_supported()
    if not g.model_known(body.model):
        raise APIError(404, f"The model `{body.model}` does not exist.", param="model", code="model_not_found")
    texts = tuple(body.prompt_texts())
    n = text_bytes(texts)
    check_prompt_size(body, g.pools.largest_context(), n)
    conv, hist = None, 0
    if g.settings.conversation_affinity:
        messages = body.wire_messages() if isinstance(body, ChatCompletionRequest) else None
        header = headers.conversation.decode("latin-1") if headers.conversation else None
        conv = conversation_key(header, body.user, messages, key.name if key is not None else "")
        hist = history_chars(messages, sum(len(t) for t in texts)) if conv is not None else 0
    ctx = request_context(texts, body.temperature, n, constraint(body))
    return Admitted(api, rid, key, body, texts, n, ctx, conv, hist, prompt_features(texts, body.temperature))


def parse_body(api: Api, raw: bytes) -> Body:
    """The body in the endpoint's schema, parsed straight from the bytes; invalid JSON, a body that is
    not an object and schema errors are 400s in OpenAI's shape."""
    schema = _SCHEMAS[api]
    try:
        return schema.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] in ("json_invalid", "model_type") and not e["loc"] for e in exc.errors()):
            parse_json(raw)  # raises the JSON error the client should see
        raise validation_error(exc.errors()) from None


def check_prompt_size(body: Body, context_tokens: int, prompt_bytes: int) -> None:
    """Refuse a prompt of `prompt_bytes` that certainly cannot fit `context_tokens` by its byte size
    alone, before it is classified or sent to a worker to tokenize."""
    limit = prompt_byte_limit(context_tokens)
    if 0 < limit < prompt_bytes:
        raise APIError(400, too_long_message(prompt_bytes, context_tokens), param=body.prompt_param,
                       code="context_length_exceeded")
