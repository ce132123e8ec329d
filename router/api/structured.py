"""Structured output and tools of a chat request: their checks (a 400 that names the parameter) and their
part of the worker's `GenerateRequest` (messages with tool calls and tool answers, `tools_json`, and the
`grammar` of specroute/contracts/grammar.py).

- `response_format`: `text` (none), `json_object` (any JSON object), `json_schema` (its `schema`,
  enforced whether or not `strict` is set). Not together with tools the model may call.
- `tools` (functions only) and `tool_choice`: `none` (the tools are not sent: the model answers in
  text), `auto` (the default with tools: the model may call, the gateway parses its calls),
  `required` or a named function (the output is constrained to exactly one call of one of the allowed
  functions, arguments matching its `parameters`).

Two reads of them route the request: its `constraint` bucket (`tools`, `json` or `none`, a dimension of
the request context, specroute/contracts/context.py: constrained outputs accept differently, so their
acceptance is learned apart), and its `definitions` (the tools' names, descriptions and parameter
schemas, or the response's JSON schema), which the classifier reads beside the messages: a request
that is to answer in tool calls or in a schema's JSON is code work, whatever its question.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

from router.http.errors import APIError
from specroute.contracts.context import JSON_CONSTRAINT, NO_CONSTRAINT, TOOLS_CONSTRAINT
from specroute.contracts.grammar import MAX_GRAMMAR_CHARS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, GrammarSpec
from specroute.v1 import engine_pb2

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
DEFINITIONS_CHARS = 1024   # of the definitions the classifier reads (all of one system message of that size)


def _bad(msg: str, param: str) -> APIError:
    return APIError(400, msg, param=param, code="invalid_value")


def _check_schema(schema: Any, param: str) -> None:
    if not isinstance(schema, dict):
        raise _bad("a JSON schema must be an object", param)
    if len(json.dumps(schema)) > MAX_GRAMMAR_CHARS:
        raise _bad(f"the schema is longer than {MAX_GRAMMAR_CHARS} characters", param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _bad(f"invalid JSON schema: {exc.message}", param) from None


def response_spec(rf: dict[str, Any] | None) -> GrammarSpec | None:
    """The grammar of a `response_format` (None for text); 400 when malformed."""
    kind = (rf or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind != "json_schema":
        raise _bad(f"response_format type must be text, json_object or json_schema, not {kind!r}", "response_format.type")
    js = (rf or {}).get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("name"), str) or not NAME.match(js["name"]):
        raise _bad("response_format.json_schema needs a name (letters, digits, _ and -, at most 64)",
                   "response_format.json_schema")
    schema = js.get("schema", {"type": "object"})
    _check_schema(schema, "response_format.json_schema.schema")
    return GrammarSpec("json_schema", json.dumps(closed(schema)))


def functions(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The `function` objects of `tools`, checked (400 naming the bad one)."""
    if tools is None:
        return []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad(f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise _bad("only tools of type 'function' with a 'function' object are supported", f"tools.{i}")
        if not isinstance(fn.get("name"), str) or not NAME.match(fn["name"]):
            raise _bad("a function name is letters, digits, _ and -, at most 64", f"tools.{i}.function.name")
        if "description" in fn and not isinstance(fn["description"], str):
            raise _bad("description must be a string", f"tools.{i}.function.description")
        if "parameters" in fn:
            _check_schema(fn["parameters"], f"tools.{i}.function.parameters")
        out.append(fn)
    if len({f["name"] for f in out}) < len(out):
        raise _bad("function names must be unique", "tools")
    return out


def tool_choice(body: Any) -> str:
    """`none` | `auto` | `required` | the name of the forced function; 400 when malformed."""
    names = [f["name"] for f in functions(body.tools)]
    tc = body.tool_choice
    if tc is None:
        return "auto" if names else "none"
    if tc in ("none", "auto") and not names:
        return "none"
    if not names:
        raise _bad("tool_choice is only allowed when tools are given", "tool_choice")
    if tc in ("none", "auto", "required"):
        return str(tc)
    fn = tc.get("function") if isinstance(tc, dict) and tc.get("type") == "function" else None
    if not isinstance(fn, dict) or fn.get("name") not in names:
        raise _bad("tool_choice must be none, auto, required or {type: function, function: {name: one of the tools}}",
                   "tool_choice")
    return str(fn["name"])


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema with `properties` that leaves it
    unset (OpenAI's strict mode): every output still matches the schema as given, and a small model
    cannot wander into invented keys until max_tokens."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in ("enum", "const", "default", "examples") else closed(v) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def calls_grammar(fns: list[dict[str, Any]]) -> GrammarSpec:
    """Exactly one call of one of `fns`, arguments matching its parameters, in the tool-call block: a
    Lark grammar in llguidance's dialect, its JSON compact (no free whitespace)."""
    def call(fn: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                 "arguments": closed(fn.get("parameters") or {"type": "object"})},
                "required": ["name", "arguments"], "additionalProperties": False}
    schema = call(fns[0]) if len(fns) == 1 else {"anyOf": [call(f) for f in fns]}
    schema["x-guidance"] = {"whitespace_flexible": False}   # compact JSON (llguidance's option), as json_schema
    lark = f"start: {json.dumps(TOOL_CALL_OPEN + chr(10))} call {json.dumps(chr(10) + TOOL_CALL_CLOSE)}\n" \
           f"call: %json {json.dumps(schema)}"
    return GrammarSpec("lark", lark)


def check_messages(body: Any) -> None:
    for i, m in enumerate(body.messages):
        if m.role == "tool" and not m.tool_call_id:
            raise _bad("a tool message needs the tool_call_id it answers", f"messages.{i}.tool_call_id")
        for j, c in enumerate(m.tool_calls or ()):
            fn = c.get("function") if isinstance(c, dict) else None
            if m.role != "assistant" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not isinstance(fn.get("arguments", ""), str):
                raise _bad("tool_calls are assistant messages' {id, type: function, function: {name, arguments}}",
                           f"messages.{i}.tool_calls.{j}")


def check_structured(body: Any) -> None:
    """All of a chat request's structured parts are well-formed and can be honoured together."""
    spec = response_spec(body.response_format)
    choice = tool_choice(body)
    if spec is not None and choice != "none":
        raise APIError(400, "response_format with tools the model may call is not supported; use tool_choice none "
                       "or a forced tool call", param="response_format", code="unsupported_parameter")
    if tools_active(body) and (body.n or 1) > 1:
        raise APIError(400, "n > 1 with tools the model may call is not supported", param="n",
                       code="unsupported_parameter")
    if tools_active(body) and body.logprobs:
        raise APIError(400, "logprobs with tools the model may call are not supported", param="logprobs",
                       code="unsupported_parameter")
    check_messages(body)


def tools_active(body: Any) -> bool:
    """Does the model see tools and may its output be tool calls (parsed by the gateway)?"""
    return bool(body.tools) and tool_choice(body) != "none"


def constraint(body: Any) -> str:
    """The constraint bucket of a checked request (`check_structured`): `tools` when the model may call
    tools, `json` under a `response_format` JSON object or schema, else `none` (so every completion request)."""
    if getattr(body, "tools", None) and tools_active(body):
        return TOOLS_CONSTRAINT
    if (getattr(body, "response_format", None) or {}).get("type", "text") != "text":
        return JSON_CONSTRAINT
    return NO_CONSTRAINT


def definitions(body: Any) -> str:
    """What the output is held to, as text for the classifier (its first `DEFINITIONS_CHARS`): the
    functions the model may call (name, description, parameters; only the forced one when one is
    forced) as JSON, or the response's JSON schema (name, schema); "" for neither."""
    if getattr(body, "tools", None) and tools_active(body):
        choice = tool_choice(body)
        fns = [f for f in functions(body.tools) if choice in ("auto", "required") or f["name"] == choice]
        return json.dumps(fns, ensure_ascii=False)[:DEFINITIONS_CHARS]
    rf = getattr(body, "response_format", None) or {}
    if rf.get("type") == "json_schema":
        return json.dumps(rf.get("json_schema"), ensure_ascii=False)[:DEFINITIONS_CHARS]
    return ""


def grammar_spec(body: Any) -> GrammarSpec | None:
    choice = tool_choice(body)
    fns = functions(body.tools)
    if choice == "required":
        return calls_grammar(fns)
    if choice not in ("none", "auto"):
        return calls_grammar([f for f in fns if f["name"] == choice])
    return response_spec(body.response_format)


def fill_chat(req: engine_pb2.GenerateRequest, body: Any) -> None:
    """The chat messages (tool calls and tool answers included), tools and grammar of a request."""
    called: dict[str, str] = {}   # tool call id -> function name (what a tool message answers)
    for m in body.messages:
        msg = req.messages.add(role="system" if m.role == "developer" else m.role, content=m.text())
        if m.tool_calls:
            msg.tool_calls_json = json.dumps(m.tool_calls)
            called.update({str(c.get("id", "")): c["function"]["name"] for c in m.tool_calls})
        if m.tool_call_id:
            msg.tool_call_id = m.tool_call_id
        if m.name or m.tool_call_id in called:
            msg.name = m.name or called[m.tool_call_id or ""]
    if tools_active(body):
        req.tools_json = json.dumps(body.tools)
    spec = grammar_spec(body)
    if spec is not None:
        req.grammar = spec.to_wire()
