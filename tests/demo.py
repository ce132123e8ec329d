"""The real demo bundle (`models/demo`), loaded once per test session (the `demo` fixture in
tests/conftest.py), with plain greedy references computed once per prompt and shared by every test
that compares against them.

    def test_x(demo):
        ref = demo.greedy(prompt_ids, 128)   # plain greedy decoding, EOS ignored, memoised

`greedy` is the reference side of every demo losslessness check: `engines.generate`'s `prefill` and
`decode_one` on a fresh cache, argmax each step, nothing shared with the speculative path. A prompt's
reference is decoded once, at the longest length asked for; shorter requests get its prefix (greedy
decoding of n tokens is the first n tokens of greedy decoding of m >= n tokens: the same forwards in
the same order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from engines.drafters.base import Drafter
from engines.generate import decode_one, prefill
from engines.model import KVCache, Transformer, load_model
from engines.tokenizer import Tokenizer

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"


def demo_trained() -> bool:
    return (DEMO / "config.json").is_file() and bool(list(DEMO.glob("model*.safetensors")))


@dataclass
class Demo:
    target: Transformer
    tok: Tokenizer
    path: Path = DEMO
    _refs: dict[tuple[int, ...], list[int]] = field(default_factory=dict)

    def greedy(self, prompt_ids: Sequence[int], n_tokens: int) -> list[int]:
        """Plain greedy decoding of `n_tokens` tokens after `prompt_ids` (EOS ignored), memoised."""
        key = tuple(prompt_ids)
        have = self._refs.get(key)
        if have is None or len(have) < n_tokens:
            have = greedy_decode(self.target, list(prompt_ids), n_tokens)
            self._refs[key] = have
        return have[:n_tokens]

    def drafter(self, kind: str, block: int | None = None) -> Drafter:
        """The bundle's trained `kind` drafter over the shared target (skips when it is not trained)."""
        if not (self.path / "drafters" / kind / "config.json").is_file():
            pytest.skip(f"{kind} drafter not trained yet ({self.path}/drafters/{kind} missing)")
        from engines.drafters.registry import load_drafter

        return load_drafter(kind, self.path, self.target, block_size=block)


@torch.no_grad()
def greedy_decode(target: Transformer, ids: list[int], n_tokens: int) -> list[int]:
    cache = KVCache.for_model(target.config, 1, len(ids) + n_tokens + 1)
    logits = target.logits(prefill(target, cache, 0, ids).hidden[0, -1])
    toks: list[int] = []
    for i in range(n_tokens):
        toks.append(int(logits.argmax()))
        if i < n_tokens - 1:
            logits = decode_one(target, cache, 0, toks[-1])
    return toks


def load_demo() -> Demo:
    """The demo target and tokenizer (skips the requesting test when the bundle is not trained)."""
    if not demo_trained():
        pytest.skip(f"demo target not trained yet ({DEMO}/config.json missing)")
    return Demo(load_model(DEMO), Tokenizer.load(DEMO))
