"""specroute/contracts/limits.py: the prompt byte bound both wings enforce before tokenizing."""

from __future__ import annotations

import json
from pathlib import Path

from specroute.contracts.limits import (
    MAX_BYTES_PER_TOKEN,
    over_context,
    prompt_byte_limit,
    text_bytes,
    too_long_message,
)

DEMO_TOKENIZER = Path(__file__).resolve().parents[3] / "models" / "demo" / "tokenizer.json"


def test_bound_and_byte_count() -> None:
    assert prompt_byte_limit(1024) == 1024 * MAX_BYTES_PER_TOKEN and prompt_byte_limit(0) == 0
    assert text_bytes(["abc", "é", "😀"]) == 3 + 2 + 4
    limit = prompt_byte_limit(16)
    assert over_context(["a" * limit], 16) is None
    assert over_context(["a" * limit, "b"], 16) == limit + 1
    assert over_context(["é" * (limit // 2 + 1)], 16) == limit + 2  # counted in UTF-8 bytes, not characters
    assert over_context(["x" * 10**6], 0) is None  # unknown context: no bound
    msg = too_long_message(limit + 1, 16)
    assert str(limit + 1) in msg and "context of 16 tokens" in msg


def test_no_demo_token_is_longer_than_the_bound_assumes() -> None:
    """The bound is exact only if no token covers more bytes than MAX_BYTES_PER_TOKEN."""
    if not DEMO_TOKENIZER.is_file():
        return
    vocab = json.loads(DEMO_TOKENIZER.read_text())["model"]["vocab"]
    # byte-level BPE: each character of a vocabulary entry stands for one byte
    assert max(len(t) for t in vocab) <= MAX_BYTES_PER_TOKEN
