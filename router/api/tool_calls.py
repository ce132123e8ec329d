"""A tool-calling completion's answer: the model's text parsed into OpenAI `tool_calls`, whole or streamed.

The model writes each call as a block `<tool_call>` JSON `</tool_call>` with the JSON
`{"name": ..., "arguments": {...}}` (specroute/contracts/grammar.py); the text outside the blocks is
the message's `content` (null when only whitespace). A block whose JSON is not such a call stays in the
content as it was written. Each call gets the id `call_<request id>_<index>` and its arguments as JSON
text; with calls, `finish_reason` is `tool_calls`.

Streamed (`ToolStream`), content is sent as it comes except text that may still open a block; a call
is sent in one `delta.tool_calls` event when its block closes (index, id, type, name, arguments).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from router.api.openai_wire import Api, Completion
from router.api.structured import tools_active
from specroute.contracts.grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


def parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a block's body, or None when it is no call."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _held(text: str) -> int:
    """Length of the longest suffix of `text` that may still begin a block."""
    return next((k for k in range(min(len(text), len(TOOL_CALL_OPEN) - 1), 0, -1)
                 if TOOL_CALL_OPEN.startswith(text[-k:])), 0)


class ToolStream:
    """Splits a model's text, piece by piece, into content and finished calls."""

    def __init__(self, rid: str) -> None:
        self.rid, self.buf, self.inside, self.calls = rid, "", False, 0

    def call(self, name: str, args: str) -> dict[str, Any]:
        c = {"index": self.calls, "id": f"call_{self.rid}_{self.calls}", "type": "function",
             "function": {"name": name, "arguments": args}}
        self.calls += 1
        return c

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The content that can be sent now and the calls finished by `text`."""
        self.buf += text
        out, calls = [], []
        while True:
            if not self.inside:
                i = self.buf.find(TOOL_CALL_OPEN)
                if i < 0:
                    k = len(self.buf) - _held(self.buf)
                    out.append(self.buf[:k])
                    self.buf = self.buf[k:]
                    break
                out.append(self.buf[:i])
                self.buf, self.inside = self.buf[i + len(TOOL_CALL_OPEN):], True
            else:
                j = self.buf.find(TOOL_CALL_CLOSE)
                if j < 0:
                    break
                body, self.buf, self.inside = self.buf[:j], self.buf[j + len(TOOL_CALL_CLOSE):], False
                parsed = parse_call(body)
                if parsed is None:
                    out.append(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)
                else:
                    calls.append(self.call(*parsed))
        return "".join(out), calls

    def flush(self) -> str:
        """What is left at the end (an unfinished block stays text)."""
        rest = (TOOL_CALL_OPEN if self.inside else "") + self.buf
        self.buf, self.inside = "", False
        return rest


def parse_tool_calls(text: str, rid: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a whole answer (calls without their stream `index`)."""
    ts = ToolStream(rid)
    content, calls = ts.feed(text)
    content += ts.flush()
    for c in calls:
        del c["index"]
    return (content.strip() or None) if calls else content, calls


class ToolCompletion(Completion):
    """`Completion` of a chat request whose model may call tools: the same bodies, with `tool_calls`."""

    __slots__ = ("stream",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stream = ToolStream(self.rid)

    def json(self, text: str, finish: str, usage: dict[str, Any], spec: dict[str, Any]) -> bytes:
        content, calls = parse_tool_calls(text, self.rid)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls" if finish == "stop" else finish
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        return orjson.dumps({**self.head(False), "choices": [choice], "usage": usage, "specroute": spec})

    def _pieces(self, content: str, calls: list[dict[str, Any]]) -> bytes:
        out = self.token_event(content) if content.strip() else b""
        for c in calls:
            out += self.event([{"index": 0, "delta": {"tool_calls": [c]}, "logprobs": None, "finish_reason": None}])
        return out

    def token_events(self, text: str) -> bytes:
        """The events of one piece of the model's text (none while a block is open)."""
        return self._pieces(*self.stream.feed(text))

    def last_events(self, finish: str | list[str], usage: dict[str, Any], spec: dict[str, Any]) -> bytes:
        finish = finish[0] if isinstance(finish, list) else finish   # one choice (n > 1 is refused with tools)
        rest = self._pieces(self.stream.flush(), [])
        if self.stream.calls and finish == "stop":
            finish = "tool_calls"
        return rest + super().last_events(finish, usage, spec)


def completion_for(api: Api, rid: str, created: int, body: Any, include_usage: bool = False) -> Completion:
    """The response builder of a request: `ToolCompletion` where its model may call tools."""
    cls = ToolCompletion if api == "chat" and tools_active(body) else Completion
    return cls(api, rid, created, body.model, include_usage)
