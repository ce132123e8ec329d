"""Checks through the official `openai` client that several suites run against their own gateway."""

from __future__ import annotations

import openai

# a strict schema whose longest output, {"name":"abcd","mood":"happy","age":99}, is 40 characters (no
# whitespace, ASCII letters only): every output ends within PERSON_MAX_TOKENS, whatever tokens spell it
PERSON = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Za-z]{1,4}$"},
                                           "mood": {"enum": ["happy", "sad"]},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "mood", "age"], "additionalProperties": False}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
PERSON_MAX_TOKENS = 48
# two strict tools (bounded arguments, so a forced call always closes)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 6},
                                                "unit": {"enum": ["C", "F"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
FUNCS = {"get_weather": WEATHER, "get_time": TIME}


def check_responses_round_trip(client: openai.OpenAI, model: str) -> None:
    """`responses.create`, a follow-up by `previous_response_id` that sees the history (its prompt holds
    both turns and the first answer), and `.stream`, whose deltas make the same text as a create."""
    first = client.responses.create(model=model, input="My name is Ada. Say hello.", max_output_tokens=16,
                                    temperature=0)
    assert first.id.startswith("resp_") and first.output_text and first.usage is not None
    follow = client.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    assert follow.previous_response_id == first.id and follow.output_text
    assert follow.usage is not None and follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    kinds, deltas = [], []
    with client.responses.stream(model=model, input="Tell me a story.", max_output_tokens=12, temperature=0) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    again = client.responses.create(model=model, input="Tell me a story.", max_output_tokens=12, temperature=0)
    assert "".join(deltas) == again.output_text
