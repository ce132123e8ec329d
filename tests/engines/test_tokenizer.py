"""The demo tokenizer: special tokens, chat template parity with transformers, round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engines.tokenizer import MASK, SPECIAL_TOKENS, Tokenizer, format_chat
from specroute.errors import UserError

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.load(DEMO)


def test_special_tokens_are_single_ids(tok):
    for t in SPECIAL_TOKENS:
        assert tok.encode(t) == [tok.token_id(t)]
    assert tok.vocab_size == 8192
    assert tok.mask_id == tok.token_id(MASK)


@pytest.mark.parametrize("text", ["def f(x):\n    return x ** 2\n", "What is 17 * 23? Let's think.",
                                  "naïve café — 日本語 🙂", "   leading spaces\n\n\ttabs"])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_matches_transformers(tok):
    hf = AutoTokenizer.from_pretrained(str(DEMO))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Add 2 and 3."}]
    ours = format_chat(msgs, add_generation_prompt=True)
    theirs = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert hf(ours, add_special_tokens=False)["input_ids"] == tok.encode_chat(msgs)
    assert hf.mask_token == MASK and hf.eos_token == "<|end|>"


def test_unknown_role_is_a_user_error():
    with pytest.raises(UserError, match="unknown chat role"):
        format_chat([{"role": "robot", "content": "x"}])
