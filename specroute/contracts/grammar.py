"""What a request's output must match (structured output, forced tool calls), as the gateway sends it
to a worker (`GenerateRequest.grammar`, JSON) and the worker compiles it (`engines/grammar.py`).

Kinds:
- `json_object`: any JSON object (`response_format: {"type": "json_object"}`);
- `json_schema`: a JSON Schema (`response_format: {"type": "json_schema", ...}`), `body` is its JSON;
- `lark`: a Lark grammar in llguidance's dialect (it may embed `%json {schema}`), `body` is its text:
  the gateway's grammar of forced tool calls (`tool_choice` `required` or a named function).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

# how a model writes a tool call (Hermes' format; engines/chat_tools.py renders it, the gateway parses it):
# TOOL_CALL_OPEN + "\n" + {"name": NAME, "arguments": {...}} + "\n" + TOOL_CALL_CLOSE
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

GrammarKind = Literal["json_object", "json_schema", "lark"]
KINDS: tuple[str, ...] = ("json_object", "json_schema", "lark")
MAX_GRAMMAR_CHARS = 64 * 1024   # a schema or grammar bigger than this is refused (400)


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    body: str = ""

    def to_wire(self) -> str:
        return json.dumps({"kind": self.kind, "body": self.body}, separators=(",", ":"))

    @classmethod
    def from_wire(cls, text: str) -> GrammarSpec | None:
        """The spec a `GenerateRequest.grammar` carries ("" = none); ValueError when malformed."""
        if not text:
            return None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"grammar is not JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.get("kind") not in KINDS or not isinstance(obj.get("body", ""), str):
            raise ValueError(f"grammar must be {{kind: one of {', '.join(KINDS)}, body: string}}")
        return cls(obj["kind"], obj.get("body", ""))
