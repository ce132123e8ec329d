"""Tools in the prompt: the chat messages and tool definitions of a tool-calling request, as the model's
own chat template takes them, or the fallback prompt format for a template without tools.

A template supports tools when it reads a `tools` variable (Qwen2.5, Hermes, Llama 3.1, ...): it gets
`tools` (the OpenAI definitions), assistant turns with `tool_calls` (arguments as objects, as
`transformers` passes them) and `tool` turns, as they are.

The fallback (the demo model's template, SmolLM2's ChatML) uses only system, user and assistant turns:
- the system turn (the first one, or a new one) ends with `FALLBACK_HEADER`, then one line per tool
  (its OpenAI `function` object as JSON), then `FALLBACK_FOOTER`;
- an assistant turn's tool calls follow its text, one block each:
  `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`;
- a tool turn becomes a user turn `<tool_response>\\n{"name": NAME, "content": TEXT}\\n</tool_response>`.
The model answers a call in that same block format (Hermes'), which the gateway parses into OpenAI
`tool_calls` (router/api/tool_calls.py) and which forced calls are constrained to.
"""

from __future__ import annotations

import json
from typing import Any

from specroute.contracts.grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

FALLBACK_HEADER = ("\n\nYou may call one or more functions to assist with the user query. "
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
FALLBACK_FOOTER = ("</tools>\n\nFor each function call, return a JSON object with the function name and "
                   "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                   '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def template_supports_tools(template: str) -> bool:
    """Does a chat template read the `tools` variable?"""
    return "tools" in template


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as an object where they are JSON text (as templates expect them)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def call_block(call: dict) -> str:
    """One OpenAI tool call (`{"function": {"name", "arguments"}}`) as a fallback `<tool_call>` block."""
    fn = call.get("function", {})
    body = json.dumps({"name": fn.get("name", ""), "arguments": _arguments(fn.get("arguments", "{}"))})
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def native_messages(messages: list[dict]) -> list[dict]:
    """Messages for a template with tools: tool calls' arguments as objects, tool turns as they are."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c.get("function", {}),
                                                  "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def fallback_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages in system / user / assistant turns only, with the tools described in the system turn."""
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            body = json.dumps({"name": m.get("name", ""), "content": content})
            out.append({"role": "user", "content": f"<tool_response>\n{body}\n</tool_response>"})
        elif role == "assistant" and m.get("tool_calls"):
            blocks = "\n".join(call_block(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{blocks}" if content else blocks})
        else:
            out.append({"role": role, "content": content})
    if tools:
        desc = FALLBACK_HEADER + "".join("\n" + json.dumps(t.get("function", t)) for t in tools) + "\n" + FALLBACK_FOOTER
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + desc}
        else:
            out.insert(0, {"role": "system", "content": desc.lstrip("\n")})
    return out
