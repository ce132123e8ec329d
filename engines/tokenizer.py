"""Our byte-level BPE tokenizer: special tokens, chat template, loading.

Special tokens (ids fixed in this order at training time):
  <|endoftext|> document separator, <|pad|>, <|mask|> (block drafters' placeholder),
  <|system|>, <|user|>, <|assistant|>, <|end|> (end of turn; the chat model's EOS).

The chat template is stored in `tokenizer_config.json` (Jinja, for `transformers.AutoTokenizer`)
and mirrored by `format_chat` here, so the worker needs no Jinja at request time; a test checks
that the two agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specroute.errors import UserError

EOT, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [EOT, PAD, MASK, SYSTEM, USER, ASSISTANT, END]
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def format_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """Same string as CHAT_TEMPLATE renders."""
    parts = []
    for m in messages:
        role = m["role"]
        if role not in ROLE_TOKENS:
            raise UserError(f"unknown chat role {role!r} (expected system, user or assistant)")
        parts.append(f"{ROLE_TOKENS[role]}\n{m['content']}{END}\n")
    if add_generation_prompt:
        parts.append(f"{ASSISTANT}\n")
    return "".join(parts)


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": END,
        "pad_token": PAD,
        "mask_token": MASK,
        "unk_token": None,
        "additional_special_tokens": [EOT, SYSTEM, USER, ASSISTANT],
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }


@dataclass
class Tokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with the ids the engines need."""

    inner: object  # tokenizers.Tokenizer

    @classmethod
    def load(cls, model_dir: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise UserError(f"no tokenizer.json in {model_dir}")
        return cls(HFTokenizer.from_file(str(path)))

    def token_id(self, token: str) -> int:
        tid = self.inner.token_to_id(token)
        if tid is None:
            raise UserError(f"tokenizer has no {token!r} token")
        return tid

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    @property
    def eos_id(self) -> int:
        return self.token_id(END)

    @property
    def mask_id(self) -> int:
        return self.token_id(MASK)

    @property
    def eot_id(self) -> int:
        return self.token_id(EOT)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.inner.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids, skip_special_tokens=False)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode(format_chat(messages, add_generation_prompt=True))


def save_tokenizer_config(out_dir: str | Path) -> None:
    (Path(out_dir) / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
