"""Structured output and tools at the gateway (router/api/structured.py, router/api/tool_calls.py): the
checks (400s naming the parameter), the worker request's grammar, tools and tool messages, and the
parsing of tool calls, whole and streamed in pieces of every size. Pure functions: < 1 s."""

from __future__ import annotations

import json

import orjson
import pytest

from classifier import classify
from router.api.openai_wire import classifier_input, generate_request
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.api.structured import DEFINITIONS_CHARS, calls_grammar, constraint, grammar_spec, tools_active
from router.api.tool_calls import ToolCompletion, ToolStream, parse_tool_calls
from router.http.errors import APIError
from specroute.contracts.grammar import GrammarSpec

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
USER = [{"role": "user", "content": "hi"}]


def body(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=kw.pop("messages", USER), **kw)


@pytest.mark.parametrize("kw, param", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [TIME, TIME]}, "tools"),
    ({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TIME], "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages.0.tool_calls.0"),
])
def test_malformed_is_a_400_naming_the_parameter(kw, param):
    with pytest.raises(APIError) as e:
        body(**kw).check_supported()
    assert e.value.status == 400 and e.value.param == param


def test_grammar_of_each_choice():
    assert grammar_spec(body()) is None
    assert grammar_spec(body(response_format={"type": "json_object"})) == GrammarSpec("json_object")
    js = grammar_spec(body(response_format={"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                                                                    "schema": {"type": "object"}}}))
    assert js == GrammarSpec("json_schema", '{"type": "object"}')
    assert grammar_spec(body(tools=[WEATHER, TIME])) is None and tools_active(body(tools=[WEATHER]))
    assert not tools_active(body(tools=[WEATHER], tool_choice="none"))
    assert grammar_spec(body(tools=[WEATHER, TIME], tool_choice="required")) == calls_grammar(
        [WEATHER["function"], TIME["function"]])
    named = grammar_spec(body(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert named is not None and named.kind == "lark" and "get_time" in named.body and "get_weather" not in named.body


SCHEMA = {"type": "json_schema", "json_schema": {"name": "trip", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}


def test_constraint_bucket_of_each_request():
    """The request context's constraint: `tools` when the model may call tools (a free or forced call),
    `json` under a JSON object or schema, else `none`."""
    assert constraint(body()) == constraint(body(response_format={"type": "text"})) == "none"
    assert constraint(body(response_format={"type": "json_object"})) == constraint(body(response_format=SCHEMA)) == "json"
    assert constraint(body(tools=[WEATHER])) == constraint(body(tools=[WEATHER], tool_choice="required")) == "tools"
    assert constraint(body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})) \
        == "tools"
    assert constraint(body(tools=[WEATHER], tool_choice="none")) == "none"   # the model does not see them
    assert constraint(body(tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"})) == "json"
    assert constraint(CompletionRequest(model="m", prompt="hi")) == "none"


@pytest.mark.parametrize("question", ["What's the weather like in Paris today?", "Tell me a fun fact about cats."])
def test_tool_definitions_and_schemas_are_evidence_of_code(question):
    """The shipped classifier reads the tools (names, descriptions, parameter schemas) or the response's
    JSON schema beside the messages: a chat question that is to be answered in a tool call or in a
    schema's JSON is code work."""
    messages = [{"role": "user", "content": question}]
    plain = classify(classifier_input(body(messages=messages)))
    assert plain.label == "chat"
    for kw in ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "required"}, {"response_format": SCHEMA}):
        p = classify(classifier_input(body(messages=messages, **kw)))
        assert p.label == "code" and p.probabilities["code"] > plain.probabilities["code"], kw
    # no definitions, no evidence: tools the model does not see, a JSON object without a schema
    for kw in ({"tools": [WEATHER], "tool_choice": "none"}, {"response_format": {"type": "json_object"}}):
        assert classifier_input(body(messages=messages, **kw)) == classifier_input(body(messages=messages))


def test_definitions_the_classifier_reads():
    forced = classifier_input(body(tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                                       "function": {"name": "get_time"}}))
    assert forced[0]["role"] == "system" and "get_time" in forced[0]["content"]
    assert "get_weather" not in forced[0]["content"] and forced[1:] == [{"role": "user", "content": "hi"}]
    both = classifier_input(body(tools=[WEATHER, TIME]))[0]["content"]
    assert all(s in both for s in ("get_weather", "Weather in a city", '"city": {"type": "string"}', "get_time"))
    assert "trip" in classifier_input(body(response_format=SCHEMA))[0]["content"]
    wordy = {"type": "function", "function": {"name": "f", "description": "Пишет длинный текст. " * 200}}
    text = classifier_input(body(tools=[wordy]))[0]["content"]
    assert len(text) == DEFINITIONS_CHARS and "Пишет" in text   # bounded, and read as written (not \u-escaped)


def test_worker_request_carries_tools_tool_turns_and_grammar():
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    b = body(messages=messages, tools=[WEATHER], tool_choice="required")
    b.check_supported()

    class D:   # the routing decision's fields the builder reads
        domain = "code"
        features: tuple[float, ...] = ()

        class context:
            key, temperature = "k", "0"
    req = generate_request(b, "r1", D())  # type: ignore[arg-type]
    assert [m.role for m in req.messages] == ["user", "assistant", "tool"]
    assert json.loads(req.messages[1].tool_calls_json)[0]["function"]["name"] == "get_weather"
    assert req.messages[2].tool_call_id == "c1" and req.messages[2].name == "get_weather"
    assert json.loads(req.tools_json) == [WEATHER]
    assert GrammarSpec.from_wire(req.grammar) == calls_grammar([WEATHER["function"]])


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def test_parse_whole():
    content, calls = parse_tool_calls(CALL, "r")
    assert content is None and calls == [{"id": "call_r_0", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    content, calls = parse_tool_calls("Let me check.\n" + CALL + "\n" + CALL.replace("Oslo", "Rome"), "r")
    assert content == "Let me check." and [c["id"] for c in calls] == ["call_r_0", "call_r_1"]
    assert parse_tool_calls("no calls <tool", "r") == ("no calls <tool", [])
    assert parse_tool_calls("<tool_call>not json</tool_call>", "r") == ("<tool_call>not json</tool_call>", [])
    assert parse_tool_calls("<tool_call>{\"name\": \"f\"", "r") == ("<tool_call>{\"name\": \"f\"", [])


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streamed_pieces_reassemble(size):
    text = "Sure <tag> " + CALL + " done"
    ts = ToolStream("r")
    content, calls = "", []
    for i in range(0, len(text), size):
        c, k = ts.feed(text[i:i + size])
        content, calls = content + c, calls + k
    content += ts.flush()
    assert content == "Sure <tag>  done" and len(calls) == 1 and calls[0]["index"] == 0
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}


def test_tool_completion_bodies():
    out = ToolCompletion("chat", "r", 1, "m")
    whole = orjson.loads(out.json(CALL, "stop", {"prompt_tokens": 1}, {}))
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    events = b"".join(out.token_events(CALL[i:i + 5]) for i in range(0, len(CALL), 5))
    events += out.last_events("stop", {}, {})
    chunks = [json.loads(line[6:]) for line in events.decode().split("\n\n") if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] == ["get_weather"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
