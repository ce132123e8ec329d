"""A `GenerateRequest`'s structured parts, for `build_request`: its chat messages with their tool calls
and tool answers, its tools, and the grammar its output must match (compiled by the backend)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specroute.contracts.grammar import GrammarSpec
from specroute.errors import UserError
from specroute.v1 import engine_pb2 as pb


class StructuredError(ValueError):
    """A malformed tool list, tool call or grammar (INVALID_ARGUMENT)."""


def _json_list(text: str, what: str) -> list[dict] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StructuredError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise StructuredError(f"{what} must be a JSON list of objects")
    return value


def chat_messages(messages: Sequence[pb.ChatMessage]) -> list[dict] | None:
    """The request's messages as the chat template takes them (tool calls, tool answers included)."""
    out: list[dict] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        calls = _json_list(m.tool_calls_json, "tool_calls_json")
        if calls:
            d["tool_calls"] = calls
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.name:
            d["name"] = m.name
        out.append(d)
    return out or None


def tools_of(r: pb.GenerateRequest) -> list[dict] | None:
    return _json_list(r.tools_json, "tools_json")


def constraint_of(r: pb.GenerateRequest, backend: Any, prefix: Sequence[int]) -> Any:
    """The compiled grammar of the request (None: unconstrained), advanced past a continuation's
    `prefix`; a backend without `constrain` cannot enforce one."""
    try:
        spec = GrammarSpec.from_wire(r.grammar)
    except ValueError as exc:
        raise StructuredError(str(exc)) from None
    if spec is None:
        return None
    constrain = getattr(backend, "constrain", None)
    if constrain is None:
        raise StructuredError("this worker cannot enforce a grammar (structured output, forced tool calls)")
    try:
        return constrain(spec, list(prefix))
    except UserError as exc:
        raise StructuredError(str(exc)) from None
