"""The Responses API (`/v1/responses`) as a translation of chat completions, pure (no I/O, no clock).

- `ResponsesRequest`: the request subset we serve (text in, text out). Every other parameter is
  refused with a 400 that names it (`check_supported`), as on the other endpoints.
- `chat_body`: the chat completions body that serves it: the earlier turns (`previous_response_id`'s
  stored conversation), `instructions` as a system message, the input items as messages.
- `response_object`: the Response object of a finished answer; `conversation`: what is stored for a
  follow-up (the turns so far, this answer included).
- `ResponseEvents`: the streamed events (`response.created` ... `response.completed`, each with its
  `sequence_number`), built from the chat stream's text deltas.

A response that stopped at `max_output_tokens` is `incomplete` (`incomplete_details.reason`), and its
stream ends with `response.incomplete`, as OpenAI's does.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from router.api.schemas import INT32_MAX, NO_EFFECT, reject_null_bytes
from router.http.errors import APIError

Message = dict[str, str]   # {"role": ..., "content": ...}, a chat message

_TEXT_PARTS = {"input_text", "output_text", "text"}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")   # unknown parameters are refused by name

    model: str = Field(min_length=1, max_length=256)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    previous_response_id: str | None = Field(default=None, max_length=256)
    store: bool | None = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = None

    def check_supported(self) -> None:
        for name in self.model_extra or {}:
            if name not in NO_EFFECT:
                raise APIError(400, f"unsupported or unrecognized parameter: {name}", param=name,
                               code="unsupported_parameter")
        fmt = (self.text or {}).get("format") or {"type": "text"}
        fmt = fmt if isinstance(fmt, dict) else {"type": fmt}
        refused = [
            ("tools", bool(self.tools), "tools are not supported on /v1/responses"),
            ("tool_choice", self.tool_choice not in (None, "auto", "none"), "tool_choice needs tools"),
            ("text", fmt.get("type") != "text", "text.format: only type 'text' is supported"),
            ("include", bool(self.include), "include is not supported"),
            ("reasoning", self.reasoning is not None, "reasoning is not supported"),
            ("background", bool(self.background), "background responses are not supported"),
            ("top_logprobs", bool(self.top_logprobs), "top_logprobs is not supported on /v1/responses"),
            ("truncation", self.truncation == "auto", "truncation 'auto' is not supported (only 'disabled')"),
        ]
        for param, bad, message in refused:
            if bad:
                raise APIError(400, message, param=param, code="unsupported_parameter")
        if self.previous_response_id is not None and not self.previous_response_id.startswith("resp_"):
            raise APIError(400, "previous_response_id must be a response id (resp_...)", param="previous_response_id",
                           code="invalid_value")

    def input_messages(self) -> list[Message]:
        """The input items as chat messages (a string is one user message)."""
        if isinstance(self.input, str):
            reject_null_bytes(self.input, "input")
            return [{"role": "user", "content": self.input}]
        out = []
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind != "message":
                raise APIError(400, f"input items of type {kind!r} are not supported (only messages)",
                               param=f"input.{i}.type", code="unsupported_parameter")
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"input.{i}.role must be user, assistant, system or developer",
                               param=f"input.{i}.role", code="invalid_value")
            out.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), i)})
        if not out:
            raise APIError(400, "input must not be empty", param="input", code="invalid_value")
        return out


def _text(content: Any, i: int) -> str:
    """A message item's text: a string, or its text parts joined."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                                           and isinstance(p.get("text"), str) for p in content):
        text = "".join(p["text"] for p in content)
    else:
        raise APIError(400, "message content must be a string or text parts (input_text)",
                       param=f"input.{i}.content", code="unsupported_parameter")
    reject_null_bytes(text, f"input.{i}.content")
    return text


def chat_body(req: ResponsesRequest, history: list[Message]) -> dict[str, Any]:
    """The chat completions body that answers `req` after the stored turns `history`."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history \
        + req.input_messages()
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    for name, value in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature),
                        ("top_p", req.top_p), ("user", req.user)):
        if value is not None:
            body[name] = value
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def conversation(req: ResponsesRequest, history: list[Message], answer: str) -> list[Message]:
    """What a follow-up's `previous_response_id` continues from: the turns so far and this answer
    (instructions are not carried over, as OpenAI's are not)."""
    return [*history, *req.input_messages(), {"role": "assistant", "content": answer}]


def new_ids() -> tuple[str, str]:
    """A new response's id and its message item's: random, never the client's request id (a response id
    is what a follow-up or a `GET` names; nobody may choose or guess another's)."""
    token = secrets.token_hex(24)
    return f"resp_{token}", f"msg_{token}"


def usage_object(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"]}


def message_item(msg_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": msg_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress"
            else []}


def response_object(req: ResponsesRequest, resp_id: str, msg_id: str, created: int, *, text: str | None = None,
                    finish: str | None = None, usage: dict[str, Any] | None = None,
                    spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Response object: in progress (`finish` None: no output yet), completed, or incomplete
    (it stopped at `max_output_tokens`)."""
    status = "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
    out: dict[str, Any] = {
        "id": resp_id, "object": "response", "created_at": created, "status": status, "model": req.model,
        "output": [] if finish is None else [message_item(msg_id, text or "", status)],
        "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p, "previous_response_id": req.previous_response_id,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
        "truncation": "disabled", "store": req.store is not False, "metadata": req.metadata or {},
        "user": req.user, "usage": usage_object(usage),
    }
    if spec is not None:
        out["specroute"] = spec
    return out


def from_chat(req: ResponsesRequest, chat: dict[str, Any], ids: tuple[str, str]) -> dict[str, Any]:
    """The Response object (`ids`: its id and its message item's) of a whole chat completion body."""
    resp_id, msg_id = ids
    choice = chat["choices"][0]
    return response_object(req, resp_id, msg_id, chat["created"], text=choice["message"]["content"] or "",
                           finish=choice["finish_reason"], usage=chat.get("usage"), spec=chat.get("specroute"))


class ResponseEvents:
    """The SSE events of one streamed response, from the chat stream's events (`on_chat`)."""

    def __init__(self, req: ResponsesRequest, ids: tuple[str, str]) -> None:
        self.req, self.ids = req, ids
        self.seq = 0
        self.text: list[str] = []
        self.started = False
        self.created = 0
        self.finish: str | None = None
        self.done: dict[str, Any] | None = None   # the final response object, once sent

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _part(self, **fields: Any) -> dict[str, Any]:
        return {"item_id": self.ids[1], "output_index": 0, "content_index": 0, **fields}

    def on_chat(self, chunk: dict[str, Any]) -> bytes:
        """The events for one chat stream event (its text delta, its finish, its usage)."""
        out = b""
        if not self.started:
            self.started, self.created = True, chunk["created"]
            resp = response_object(self.req, *self.ids, self.created)
            out += self._event("response.created", response=resp) + self._event("response.in_progress", response=resp)
            out += self._event("response.output_item.added", output_index=0,
                               item=message_item(self.ids[1], "", "in_progress"))
            out += self._event("response.content_part.added",
                               **self._part(part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        for c in chunk.get("choices") or ():
            delta = (c.get("delta") or {}).get("content")
            if delta:
                self.text.append(delta)
                out += self._event("response.output_text.delta", **self._part(delta=delta, logprobs=[]))
            if c.get("finish_reason"):
                self.finish = c["finish_reason"]
        if chunk.get("usage") is not None:
            out += self._last(chunk["usage"], chunk.get("specroute"))
        return out

    def _last(self, usage: dict[str, Any], spec: dict[str, Any] | None) -> bytes:
        text = "".join(self.text)
        resp = response_object(self.req, *self.ids, self.created, text=text, finish=self.finish or "stop",
                               usage=usage, spec=spec)
        item = resp["output"][0]
        self.done = resp
        return (self._event("response.output_text.done", **self._part(text=text, logprobs=[]))
                + self._event("response.content_part.done", **self._part(part=item["content"][0]))
                + self._event("response.output_item.done", output_index=0, item=item)
                + self._event("response.completed" if resp["status"] == "completed" else "response.incomplete",
                              response=resp))

    def on_error(self, error: dict[str, Any]) -> bytes:
        """The events of a stream that ended in an error: `error`, then `response.failed`."""
        err = error.get("error") or {}
        out = self._event("error", code=err.get("code"), message=err.get("message", "error"), param=err.get("param"))
        if self.started:
            resp = response_object(self.req, *self.ids, self.created)
            resp["status"] = "failed"
            resp["error"] = {"code": err.get("code") or "server_error", "message": err.get("message", "error")}
            out += self._event("response.failed", response=resp)
        return out
