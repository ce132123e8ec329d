"""A tiny bundle over a one-character vocabulary (the 7 special tokens, newline and the 95 printable
ASCII characters; no merges) for distribution tests through the served path.

Every token decodes to one character (or a special token's name), so an answer's text gives back its
tokens (`answer_tokens`). The random target's final norm is scaled so that its next-token
distributions are spread over a handful of characters (a few thousand samples fill a histogram of
its first tokens), and its random drafters, which share its LM head, are narrowed to the characters
the target puts most mass on after the prompts, so that their drafts are accepted part of the time
and rejected the rest.

    from tests.ascii_bundle import make_ascii_bundle
    path = make_ascii_bundle(tmp_path / "bundle", prompts, drafters=("mtp", "dfly", "eagle3"))
"""

from __future__ import annotations

from pathlib import Path

import torch

from engines.model import ModelConfig, Transformer, init_weights, load_model, save_model
from engines.tokenizer import END, SPECIAL_TOKENS, Tokenizer, save_tokenizer_config

LOGIT_SCALE = 2.0   # the final norm's gain: a larger one makes the target's distributions peakier
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


def save_ascii_tokenizer(out: Path) -> int:
    """tokenizer.json (byte-level BPE over CHARS, no merges) and tokenizer_config.json -> vocabulary size."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    byte_char = dict(zip(range(256), sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_order), strict=True))
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *(byte_char[ord(c)] for c in CHARS)])}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    save_tokenizer_config(out)
    return len(vocab)


def _byte_order(ch: str) -> int:
    """GPT-2's byte -> character map, inverted: the byte a ByteLevel alphabet character stands for."""
    return _BYTE_OF[ch]


def _gpt2_bytes() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_OF = _gpt2_bytes()


def make_ascii_bundle(out: Path, prompts: list[list[dict[str, str]]], drafters: tuple[str, ...] = ("mtp", "dfly", "eagle3"),
                      seed: int = 0, draft_vocab: int = 12) -> Path:
    """The bundle at `out`; its drafters' vocabularies are the `draft_vocab` characters the target
    puts most mass on after the chat `prompts`."""
    vocab = save_ascii_tokenizer(out)
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=SPECIAL_TOKENS.index(END))
    model = Transformer(cfg)
    init_weights(model, std=0.2)
    with torch.no_grad():
        model.model.norm.weight.fill_(LOGIT_SCALE)
    save_model(model, out, dtype=torch.float32)
    if drafters:
        from engines.drafters.registry import new_drafter, save_drafter

        tok = Tokenizer.load(out)
        target = load_model(out).eval()
        common = commonest_tokens(target, [tok.encode_chat(m) for m in prompts], draft_vocab)
        for kind in drafters:
            d = new_drafter(kind, target)
            d.set_draft_vocab(common)
            save_drafter(d, out / "drafters" / kind, dtype=torch.float32)
    return out


@torch.no_grad()
def commonest_tokens(target: Transformer, prompts: list[list[int]], n: int) -> torch.Tensor:
    """The `n` tokens with the most next-token probability summed over the prompts' last positions."""
    mass = torch.zeros(target.config.vocab_size)
    for ids in prompts:
        out = target(torch.tensor([ids]), torch.arange(len(ids))[None])
        mass += torch.softmax(target.logits(out.hidden)[0, -1], -1)
    return mass.topk(n).indices.sort().values


def answer_tokens(tok: Tokenizer, text: str, finish_reason: str) -> tuple[int, ...]:
    """An answer's tokens from its text (one token per character or special token's name), the end
    of turn appended where the model stopped."""
    ids = tuple(tok.encode(text))
    return (*ids, tok.eos_id) if finish_reason == "stop" else ids
