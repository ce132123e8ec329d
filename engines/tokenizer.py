"""A bundle's tokenizer: `tokenizer.json`, and from `tokenizer_config.json` its chat template, EOS
token and the placeholder token block drafters feed (`mask_token`).

Our own byte-level BPE (the demo bundle) has fixed special tokens, in this order:
  <|endoftext|> document separator, <|pad|>, <|mask|> (block drafters' placeholder),
  <|system|>, <|user|>, <|assistant|>, <|end|> (end of turn; the chat model's EOS).
Its chat template (`CHAT_TEMPLATE`) is mirrored by `format_chat`, so rendering it needs no Jinja; a
test checks that the two agree. Any other template (an imported model's own, e.g. ChatML) is
rendered by a sandboxed, compiled Jinja template, as `transformers` renders it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from engines.chat_tools import fallback_messages, native_messages, template_supports_tools
from specroute.errors import UserError

EOT, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = [EOT, PAD, MASK, SYSTEM, USER, ASSISTANT, END]
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}

CHAT_ROLES = ("system", "user", "assistant")
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


def _token_text(value: Any) -> str | None:
    """A special token as `tokenizer_config.json` writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _check_roles(messages: list[dict]) -> None:
    for m in messages:
        if m.get("role") not in CHAT_ROLES:
            raise UserError(f"unknown chat role {m.get('role')!r} (expected system, user or assistant)")


@dataclass
class Tokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with the ids and the chat format the engines need."""

    inner: object  # tokenizers.Tokenizer
    chat_template: str = CHAT_TEMPLATE
    eos_token: str = END
    mask_token: str = MASK
    bos_token: str | None = None

    @classmethod
    def load(cls, model_dir: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise UserError(f"no tokenizer.json in {model_dir}")
        cfg_path = Path(model_dir) / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        template = cfg.get("chat_template")
        jinja = Path(model_dir) / "chat_template.jinja"
        if not template and jinja.is_file():
            template = jinja.read_text()
        return cls(HFTokenizer.from_file(str(path)), chat_template=template or CHAT_TEMPLATE,
                   eos_token=_token_text(cfg.get("eos_token")) or END,
                   mask_token=_token_text(cfg.get("mask_token")) or MASK,
                   bos_token=_token_text(cfg.get("bos_token")))

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
        return self.token_id(self.eos_token)

    @property
    def mask_id(self) -> int:
        return self.token_id(self.mask_token)

    @property
    def eot_id(self) -> int:
        return self.token_id(EOT)

    def special_ids(self) -> list[int]:
        """Ids of the tokenizer's special (added, special) tokens."""
        return sorted(i for i, t in self.inner.get_added_tokens_decoder().items() if t.special)

    @cached_property
    def _template(self) -> Any:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise UserError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.chat_template)
        except TemplateError as exc:
            raise UserError(f"chat template does not compile: {exc}") from None

    def format_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> str:
        """The prompt string of `messages` in this model's chat format; with `tools` (or tool turns) the
        template renders them where it reads `tools`, else the fallback format (engines/chat_tools.py)."""
        if tools or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
            if not template_supports_tools(self.chat_template):
                return self.format_chat(fallback_messages(messages, tools), add_generation_prompt)
            return self._template.render(messages=native_messages(messages), tools=tools or None,
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token)
        if self.chat_template == CHAT_TEMPLATE:
            return format_chat(messages, add_generation_prompt)
        _check_roles(messages)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.inner.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids, skip_special_tokens=False)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return self.encode(self.format_chat(messages, add_generation_prompt=True, tools=tools))

    def token_piece(self, token_id: int) -> tuple[str, bytes]:
        """One token's text and its bytes (OpenAI's logprob `token` and `bytes`). A byte-level BPE token
        may hold part of a UTF-8 character: its bytes are the raw ones, its text their lossy decoding."""
        piece = self._pieces.get(token_id)
        if piece is None:
            raw = self.inner.id_to_token(token_id) or ""
            if raw and all(c in _BYTE_OF for c in raw) and token_id not in self.special_ids():
                data = bytes(_BYTE_OF[c] for c in raw)
            else:
                data = self.decode([token_id]).encode("utf-8")
            piece = self._pieces[token_id] = (data.decode("utf-8", errors="replace"), data)
        return piece

    @cached_property
    def _pieces(self) -> dict[int, tuple[str, bytes]]:
        return {}


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character of each byte (GPT-2's table), inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_level_alphabet()


def save_tokenizer_config(out_dir: str | Path) -> None:
    (Path(out_dir) / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
