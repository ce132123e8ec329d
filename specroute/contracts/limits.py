"""Request limits both wings enforce the same way: the gateway before it opens a worker stream, the
worker before it tokenizes (so an over-long prompt costs neither side more than counting its bytes).

A prompt of `n` UTF-8 bytes has at least `n / MAX_BYTES_PER_TOKEN` tokens: no token of a byte-level
tokenizer we serve covers more bytes than that (the demo tokenizer's longest token is far shorter;
GPT-style vocabularies top out around a few dozen bytes), and a chat template only adds tokens. So a
prompt over `prompt_byte_limit(context)` bytes cannot fit the context, and rejecting it is exact,
never a guess; prompts under the bound are tokenized and checked precisely.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_BYTES_PER_TOKEN = 64
MAX_STOP_SEQUENCES = 16  # the worker's limit (the OpenAI API allows 4; the gateway enforces that too)
MAX_STOP_CHARS = 256  # characters per stop sequence


def prompt_byte_limit(context_tokens: int, bytes_per_token: int = MAX_BYTES_PER_TOKEN) -> int:
    """The most UTF-8 bytes a prompt can have and still fit `context_tokens` tokens (0 = unknown
    context: no bound)."""
    return max(0, context_tokens) * bytes_per_token


def text_bytes(texts: Iterable[str]) -> int:
    """UTF-8 size of the prompt's texts (message contents or the prompt), without building a copy of
    the whole prompt: ASCII text (the usual case) is counted by its length."""
    total = 0
    for t in texts:
        total += len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass"))
    return total


def over_context(texts: Iterable[str], context_tokens: int) -> int | None:
    """The prompt's byte size when it certainly exceeds a context of `context_tokens` tokens, else None."""
    limit = prompt_byte_limit(context_tokens)
    if limit <= 0:
        return None
    n = text_bytes(texts)
    return n if n > limit else None


def too_long_message(n_bytes: int, context_tokens: int) -> str:
    """The one wording of the byte-bound rejection (gateway and worker say the same thing)."""
    return (f"prompt is {n_bytes} bytes, more than a context of {context_tokens} tokens can hold "
            f"(at most {prompt_byte_limit(context_tokens)} bytes); shorten the prompt")
