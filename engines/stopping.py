"""Incremental detokenization with EOS, stop strings and max-token limits.

Every engine feeds emitted tokens here one at a time (a speculative step emits several), so a
stop string or EOS in the middle of an accepted block ends the output exactly where plain AR
decoding would. Text that could be the start of a stop string is held back until it is decided;
incomplete UTF-8 sequences are held back until their last byte arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class StopState:
    decode: Callable[[list[int]], str]
    eos_ids: frozenset[int]
    stop: Sequence[str] = ()
    max_tokens: int = 256
    tokens: list[int] = field(default_factory=list)
    emitted_chars: int = 0
    finish_reason: str = ""
    text: str = ""

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    def push(self, token: int) -> str:
        """Add one token; return the newly final text (may be empty). Sets finish_reason."""
        if self.done:
            return ""
        if token in self.eos_ids:
            self.finish_reason = "stop"
            return self._flush(len(self.text))
        self.tokens.append(token)
        text = self.decode(self.tokens)
        if text.endswith("\ufffd"):  # incomplete UTF-8: wait for the rest unless we must stop
            if len(self.tokens) >= self.max_tokens:
                self.finish_reason = "length"
                self.text = text
                return self._flush(len(text))
            return ""
        self.text = text
        for s in self.stop:
            idx = text.find(s, max(0, self.emitted_chars - len(s) + 1))
            if idx != -1:
                self.finish_reason = "stop"
                self.text = text[:idx]
                return self._flush(idx)
        if len(self.tokens) >= self.max_tokens:
            self.finish_reason = "length"
            return self._flush(len(text))
        hold = max((_partial_suffix(text, s) for s in self.stop), default=0)
        return self._flush(len(text) - hold)

    def push_many(self, tokens: Sequence[int]) -> tuple[str, int]:
        """Push tokens until done. -> (text delta, number of tokens consumed)."""
        out, used = [], 0
        for t in tokens:
            if self.done:
                break
            out.append(self.push(t))
            used += 1
        return "".join(out), used

    def _flush(self, upto: int) -> str:
        upto = max(upto, self.emitted_chars)
        delta = self.text[self.emitted_chars:upto]
        self.emitted_chars = upto
        return delta


def _partial_suffix(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
