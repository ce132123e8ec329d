"""OpenAI's `logprobs` objects from the worker's `TokenLogprob`s (specroute/v1 engine.proto), pure.

- chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": None}`;
- legacy completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`,
  the offsets counted in characters from the start of the choice's text (`offset`: where this part starts).

A streamed chunk carries the logprobs of its own tokens (a chunk whose text is held back for a stop
string may carry tokens before their text). The values are the target's (engines/logprobs.py): the
distribution each token was sampled from, -9999 for a token it could not sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _entry(lp: Any) -> dict[str, Any]:
    return {"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.token_bytes)}


def chat_content(entries: Sequence[Any]) -> list[dict[str, Any]]:
    """The `content` list of chat's logprobs object."""
    return [{**_entry(lp), "top_logprobs": [_entry(t) for t in lp.top]} for lp in entries]


def chat_logprobs(entries: Sequence[Any]) -> dict[str, Any]:
    return {"content": chat_content(entries), "refusal": None}


def legacy_logprobs(entries: Sequence[Any], offset: int = 0) -> dict[str, Any]:
    """Legacy completions' logprobs object of `entries`, whose text starts at character `offset`."""
    offsets = []
    for lp in entries:
        offsets.append(offset)
        offset += len(lp.token)
    return {"tokens": [lp.token for lp in entries], "token_logprobs": [lp.logprob for lp in entries],
            "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in entries], "text_offset": offsets}


def logprobs_object(api: str, entries: Sequence[Any], offset: int = 0) -> dict[str, Any]:
    """The logprobs object of a choice (or of a streamed chunk of it) for endpoint `api`."""
    return chat_logprobs(entries) if api == "chat" else legacy_logprobs(entries, offset)


def text_length(entries: Sequence[Any]) -> int:
    """Characters the entries' tokens span (a legacy stream's running `text_offset`)."""
    return sum(len(lp.token) for lp in entries)
