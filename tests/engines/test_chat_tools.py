"""Tools in the prompt (engines/chat_tools.py through `Tokenizer.format_chat`): the fallback format for a
template without tools (the demo's), and a template that reads `tools` gets them, tool calls and tool
turns as they are. The demo tokenizer only: < 1 s."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engines.chat_tools import FALLBACK_FOOTER, fallback_messages
from engines.tokenizer import Tokenizer

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
CHAT = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if not (DEMO / "tokenizer.json").is_file():
        pytest.skip("no demo tokenizer")
    return Tokenizer.load(DEMO)


def test_fallback_renders_tools_calls_and_answers(tok):
    text = tok.format_chat(CHAT, tools=[TOOL])
    assert text.startswith("<|system|>\nYou may call one or more functions")
    assert json.dumps(TOOL["function"]) in text and FALLBACK_FOOTER in text
    assert '<|assistant|>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|end|>' in text
    assert '<|user|>\n<tool_response>\n{"name": "get_weather", "content": "sunny"}\n</tool_response>' in text
    assert text.endswith("<|assistant|>\n")
    # an existing system turn gets the tools appended; no tools and no tool turns: the plain template
    msgs = fallback_messages([{"role": "system", "content": "Be brief."}, *CHAT[:1]], [TOOL])
    assert msgs[0]["content"].startswith("Be brief.\n\nYou may call") and len(msgs) == 2
    assert tok.format_chat(CHAT[:1]) == "<|user|>\nWeather?<|end|>\n<|assistant|>\n"


def test_template_with_tools_gets_them(tok):
    template = ("{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
                "{% for m in messages %}{{ m.role }}:{{ m.content }}"
                "{% for c in m.tool_calls or [] %}<{{ c.function.name }} {{ c.function.arguments.city }}>{% endfor %}"
                "|{% endfor %}")
    t = replace(tok, chat_template=template)
    assert t.format_chat(CHAT, tools=[TOOL]) == "[get_weather]user:Weather?|assistant:<get_weather Oslo>|tool:sunny|"
