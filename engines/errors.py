"""What the engine core raises when a request or a pairing cannot be served as given.

The core (decoders, generation loops, the factory) never raises the CLI's `UserError`: it raises these,
and each edge translates them with the same message (`specroute generate` and `specroute bench` into a
one-line `UserError`, the gRPC worker into INVALID_ARGUMENT or an error event). All are `ValueError`s.
"""

from __future__ import annotations


class EngineError(ValueError):
    """A request or configuration the engine refuses (bad input, not a bug)."""


class EmptyPrompt(EngineError):
    """The prompt has no tokens."""


class PromptTooLong(EngineError):
    """The prompt leaves no room for output in the context."""


class ContextFull(EngineError):
    """A slot's context is full: nothing more can be verified in it."""


class DrafterMismatch(EngineError):
    """The drafter was built for another target model."""


class UnknownEngine(EngineError):
    """An engine kind that is neither AR nor a registered drafter."""


class BundleMismatch(EngineError):
    """The parts of a model bundle do not fit together (e.g. tokenizer vs vocabulary)."""


def check_room(prompt_len: int, max_len: int) -> None:
    """A prompt of `prompt_len` tokens must be non-empty and leave room for output in `max_len`."""
    if prompt_len == 0:
        raise EmptyPrompt("empty prompt")
    if prompt_len >= max_len:
        raise PromptTooLong(f"prompt is {prompt_len} tokens; the context holds {max_len} (prompt + output)")
