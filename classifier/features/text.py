"""The request text the classifier reads: the system prompt and the last user turns, head and tail only.

`request_text(messages)` picks the text (a plain string for completions) and keeps only the head and
tail of long inputs, so a 100 KB prompt costs about as much as a 4 KB one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HEAD_CHARS = 1024  # characters read from the start of a long input
TAIL_CHARS = 1024  # ... and from its end
PART_CHARS = HEAD_CHARS + TAIL_CHARS
MAX_SAMPLE_CHARS = PART_CHARS + 1  # what request_text returns at most (head + "\n" + tail)
USER_TURNS = 2  # how many of the last user turns are read in a multi-turn request


def _content_text(content: Any) -> str:
    """Text of one message `content`: a string, bytes, or OpenAI-style content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content).decode("utf-8", errors="replace")
    if isinstance(content, Mapping):
        text = content.get("text")
        return text if isinstance(text, str) else ""
    if isinstance(content, Sequence):
        return "\n".join(_content_text(part) for part in content[:64] if not isinstance(part, str | bytes))
    return ""


def head_tail(text: str, head: int = HEAD_CHARS, tail: int = TAIL_CHARS) -> str:
    """`text`, or its first `head` and last `tail` characters joined by a newline when longer."""
    if len(text) <= head + tail:
        return text
    return text[:head] + "\n" + text[-tail:]


def _role_and_content(message: Any) -> tuple[str, Any]:
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    elif isinstance(message, str | bytes):
        role, content = "user", message
    else:  # pydantic models or other objects with attributes
        role, content = getattr(message, "role", None), getattr(message, "content", None)
    return (role if isinstance(role, str) else "user"), content


def request_text(messages: Any) -> tuple[str, int]:
    """(sample, full_length): the text the classifier reads and the length of what it stands for.

    `messages` is a list of `{"role", "content"}` messages (dicts or objects), or a plain string /
    bytes for completions. The system prompt and the last `USER_TURNS` user turns are read; each part
    and the joined result keep only their head and tail. Anything malformed counts as no text.
    """
    if isinstance(messages, str):
        return head_tail(messages), len(messages)
    if isinstance(messages, bytes | bytearray | memoryview):
        raw = bytes(messages)
        if len(raw) > 4 * PART_CHARS:  # bound the decode cost too
            raw = raw[: 4 * HEAD_CHARS] + b"\n" + raw[-4 * TAIL_CHARS :]
        return head_tail(raw.decode("utf-8", errors="replace")), len(messages)
    if not isinstance(messages, Iterable) or isinstance(messages, Mapping):
        if isinstance(messages, Mapping):
            messages = [messages]
        else:
            return "", 0
    try:
        items = list(messages)
    except Exception:  # a broken iterable is treated as empty input
        return "", 0
    system: list[str] = []
    users: list[str] = []
    total = 0
    for message in items:
        role, content = _role_and_content(message)
        if role in ("system", "developer"):
            text = _content_text(content)
            system.append(head_tail(text, HEAD_CHARS // 2, TAIL_CHARS // 2))
            total += len(text)
    n_users = 0
    for message in reversed(items):
        role, content = _role_and_content(message)
        if role in ("system", "developer", "assistant", "tool", "function"):
            continue
        text = _content_text(content)
        users.append(head_tail(text))
        total += len(text)
        n_users += 1
        if n_users >= USER_TURNS:
            break
    users.reverse()
    return head_tail("\n".join(system + users)), total
