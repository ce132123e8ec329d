"""OpenAI wire translation, pure (no I/O, no clock): request bodies to the worker's
`GenerateRequest`, worker chunks to the completion's text/usage/statistics, and every response body
(the whole JSON and each SSE event, built by the same functions), plus the decision headers.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.api.structured import definitions, fill_chat
from router.http.asgi import Headers
from router.http.errors import APIError
from router.routing.decide import Decision
from specroute.contracts.context import DEFAULT_TEMPERATURE
from specroute.contracts.feedback import FeedbackRecord, build_record
from specroute.contracts.stats import mean_accepted_length
from specroute.v1 import engine_pb2

Api = Literal["chat", "completion"]   # which endpoint: chat or (legacy) completions
Body = ChatCompletionRequest | CompletionRequest

_FINISH = {"stop": "stop", "length": "length", "": "stop"}
_OBJECT = {("chat", False): "chat.completion", ("chat", True): "chat.completion.chunk",
           ("completion", False): "text_completion", ("completion", True): "text_completion"}
_ID_PREFIX = {"chat": "chatcmpl", "completion": "cmpl"}
_MARK = "\x00"  # stands for a token's text in the per-token event template
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
SSE_DONE = b"data: [DONE]\n\n"


# -- request -------------------------------------------------------------------------------------
def classifier_input(body: Body) -> list[dict[str, str]]:
    """What the classifier reads: the chat messages, or the prompt as one user message. Before a chat's
    messages, as a system message, the definitions its output is held to (router/api/structured.py
    `definitions`: tools or a JSON schema), which are evidence of code work."""
    if isinstance(body, ChatCompletionRequest):
        messages = [{"role": r, "content": c} for r, c in body.wire_messages()]
        defs = definitions(body)
        return [{"role": "system", "content": defs}, *messages] if defs else messages
    return [{"role": "user", "content": body.prompt_text()}]


def generate_request(body: Body, request_id: str, d: Decision, choice: int = 0) -> engine_pb2.GenerateRequest:
    """The worker request for choice `choice` of an OpenAI body routed by `d` (the pool and the mode
    are set per attempt by the dispatcher): the context key and temperature bucket travel as computed
    here; choice i of a seeded request is seeded with `seed + i` (wrapping within int64)."""
    ctx = d.context
    req = engine_pb2.GenerateRequest(request_id=request_id, domain=d.domain, context=ctx.key,
                                     temperature_bucket=ctx.temperature, features=d.features)
    if isinstance(body, ChatCompletionRequest):
        fill_chat(req, body)   # messages, tools and grammar (router/api/structured.py)
    else:
        req.prompt = body.prompt_text()
    sp = req.sampling
    sp.temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    sp.top_p = 1.0 if body.top_p is None else body.top_p
    if body.seed is not None:
        sp.has_seed = True
        sp.seed = (body.seed + choice + 2**63) % 2**64 - 2**63
    top = body.top_logprobs_wanted()
    if top is not None:
        req.logprobs, req.top_logprobs = True, top
    req.max_tokens = body.effective_max_tokens() or 0
    req.stop.extend(body.stop_list())
    # a non-streaming answer is read whole (the unary `Complete`; `coalesce` for a worker without it)
    req.coalesce = not body.stream
    return req


# -- worker chunks -------------------------------------------------------------------------------
class Collected:
    """Text, token counts, finish reason and speculative statistics of a worker stream so far."""

    __slots__ = ("text", "finish", "prompt_tokens", "cached_tokens", "completion_tokens", "num_tokens", "stats",
                 "ttft_s", "logprobs")

    def __init__(self, ttft_s: float = 0.0) -> None:
        self.text: list[str] = []
        self.finish = ""
        self.prompt_tokens = 0
        self.cached_tokens = 0      # of the prompt's tokens, read from the worker's prefix cache
        self.completion_tokens = 0
        self.num_tokens = 0
        self.stats: Any = None  # engine_pb2 stats of the final chunk
        self.ttft_s = ttft_s
        self.logprobs: list[Any] = []   # engine_pb2.TokenLogprob of every token so far (when asked for)

    def add(self, c: Any) -> None:
        if c.text:
            self.text.append(c.text)
        if c.logprobs:
            self.logprobs.extend(c.logprobs)
        self.num_tokens += c.num_tokens
        if c.prompt_tokens:
            self.prompt_tokens = c.prompt_tokens
        if c.finish_reason:
            self.finish = c.finish_reason
            self.completion_tokens = c.completion_tokens or self.num_tokens
            self.cached_tokens = c.cached_prompt_tokens
            if c.HasField("stats"):
                self.stats = c.stats

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage object; `prompt_tokens_details.cached_tokens` is how much of the prompt the
        worker read from its prefix cache (vLLM pools with prefix caching; 0 on our engine)."""
        ct = self.completion_tokens or self.num_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": ct,
                "total_tokens": self.prompt_tokens + ct,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def counts(self) -> tuple[int, int, int]:
        """Drafted and accepted tokens and verification steps (zeros without statistics)."""
        s = self.stats
        if s is None:
            return 0, 0, 0
        return int(s.drafted_tokens), int(s.accepted_tokens), int(s.steps)

    def steps_by_drafter(self) -> dict[str, int]:
        """Verification steps by what drafted them (a drafter's kind, or `plain`); {} when the worker
        cannot tell."""
        s = self.stats
        return {} if s is None else {k: int(v) for k, v in sorted(s.steps_by_drafter.items())}

    def mean_accepted_length(self) -> float:
        """The worker's mean accepted length, else the one its counts give."""
        s = self.stats
        if s is not None and s.mean_accepted_length:
            return float(s.mean_accepted_length)
        _, accepted, steps = self.counts()
        return mean_accepted_length(accepted, steps)


def finish_reason(reason: str) -> str:
    """The OpenAI `finish_reason` for a worker's; a worker that ended in error is a 502."""
    if reason in ("error", "cancelled"):
        raise APIError(502, f"worker ended the request with {reason!r}", code="worker_error")
    return _FINISH.get(reason, reason)


def served_reason(d: Decision, pool: str | None) -> str:
    """The decision's reason, or `fallback` when another pool served the request."""
    return d.reason if pool == d.pool else "fallback"


def spec_object(d: Decision, pool: str, col: Collected) -> dict[str, Any]:
    """The response's extra top-level `specroute` object (ARCHITECTURE.md)."""
    drafted, accepted, steps = col.counts()
    return {
        "domain": d.domain,
        "pool": pool,
        "reason": served_reason(d, pool),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "steps": steps,
        "mean_accepted_length": col.mean_accepted_length(),
        "steps_by_drafter": col.steps_by_drafter(),
    }


def gateway_record(d: Decision, pool: str, col: Collected, worker_s: float, request_id: str = "") -> FeedbackRecord:
    """The acceptance feedback of one served request, as the gateway saw it (`--gateway-feedback`)."""
    return build_record(request_id=request_id, pool=pool, domain=d.domain, context=d.context.key, engine="gateway",
                        tokens=col.completion_tokens or col.num_tokens, counts=col.counts(), wall_s=worker_s,
                        ttft_s=col.ttft_s, features=d.features)


# -- response ------------------------------------------------------------------------------------
def decision_headers(d: Decision, pool: str | None, policy_version: int, overhead_s: float, rid: str) -> Headers:
    """The `x-specroute-*` decision headers (and `x-request-id`) of every completion response."""
    return [
        (b"x-specroute-domain", d.domain.encode("latin-1")),
        (b"x-specroute-pool", (pool or "none").encode("latin-1")),
        (b"x-specroute-reason", served_reason(d, pool).encode("latin-1")),
        (b"x-specroute-policy-version", b"%d" % policy_version),
        (b"x-specroute-overhead-ms", b"%.3f" % (overhead_s * 1000.0)),
        (b"x-request-id", rid.encode("latin-1")),
    ]


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Completion:
    """Every body of one completion response: `json` for the whole answer, or the SSE events of a
    stream (`role_event`, `token_event`, `last_events`). The fields common to all (id, object,
    created, model) and the choice shapes are written once, here."""

    __slots__ = ("api", "rid", "created", "model", "include_usage", "_token_head", "_token_tail")

    def __init__(self, api: Api, rid: str, created: int, model: str, include_usage: bool = False) -> None:
        self.api, self.rid, self.created, self.model = api, rid, created, model
        self.include_usage = include_usage
        self._token_head = self._token_tail = b""

    def head(self, stream: bool) -> dict[str, Any]:
        h: dict[str, Any] = {"id": f"{_ID_PREFIX[self.api]}-{self.rid}", "object": _OBJECT[(self.api, stream)],
                             "created": self.created, "model": self.model}
        if stream and self.include_usage:
            h["usage"] = None
        return h

    def choice(self, text: str | None, finish: str | None, *, stream: bool, role: bool = False, index: int = 0,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """One choice (`logprobs`: its logprobs object, router/api/logprobs.py)."""
        if self.api == "completion":
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if not stream:
            return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                    "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def json(self, text: str, finish: str, usage: dict[str, Any], spec: dict[str, Any], *,
             logprobs: dict[str, Any] | None = None, choices: list[dict[str, Any]] | None = None) -> bytes:
        """The whole non-streaming response body: one choice, or the given `choices` (n > 1)."""
        if choices is None:
            choices = [self.choice(text, finish, stream=False, logprobs=logprobs)]
        return orjson.dumps({**self.head(False), "choices": choices, "usage": usage, "specroute": spec})

    def event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        """One SSE event of the stream."""
        return sse({**self.head(True), "choices": choices, **extra})

    def role_event(self, n: int = 1) -> bytes:
        """A chat stream's first event(s): the assistant role and empty content, one per choice."""
        return b"".join(self.event([self.choice("", None, stream=True, role=True, index=i)]) for i in range(n))

    def token_event(self, text: str, index: int = 0, logprobs: dict[str, Any] | None = None) -> bytes:
        if index or logprobs is not None:
            return self.event([self.choice(text, None, stream=True, index=index, logprobs=logprobs)])
        if not self._token_head:
            # the per-token event is `event([choice(text, None)])`: its fixed parts are encoded once
            # per stream (split at the last mark: the model name may contain one too)
            template = self.event([self.choice(_MARK, None, stream=True)])
            self._token_head, self._token_tail = template.rsplit(orjson.dumps(_MARK), 1)
        return self._token_head + orjson.dumps(text) + self._token_tail

    def token_events(self, text: str) -> bytes:
        """The events of one piece of the model's text (`router.api.tool_calls.ToolCompletion` parses it)."""
        return self.token_event(text)

    def last_events(self, finish: str | list[str], usage: dict[str, Any], spec: dict[str, Any]) -> bytes:
        """The finishing event of each choice (the last with `specroute`, or followed by the usage
        event that carries it when `include_usage`) and the `[DONE]` terminator."""
        finishes = [finish] if isinstance(finish, str) else finish
        events = [self.choice(None if self.api == "chat" else "", f, stream=True, index=i) for i, f in enumerate(finishes)]
        out = b"".join(self.event([c]) for c in events[:-1])
        if not self.include_usage:
            return out + self.event(events[-1:], specroute=spec) + SSE_DONE
        return out + self.event(events[-1:]) + self.event([], usage=usage, specroute=spec) + SSE_DONE
