"""A tiny bundle over a one-character vocabulary (the 7 special tokens, newline and the 95 printable
ASCII characters; no merges) for distribution tests through the served path.

Every token decodes to one character (or a special token's name), so an answer's text gives back its
tokens (`answer_tokens`). The target is mostly a bigram model: its random layers' residual branches
are scaled by CONTEXT, so the embedding of the last token dominates its final hidden state and the
context moves its next-token distribution a little (the final norm's gain LOGIT_SCALE spreads that
distribution over a handful of characters, so a few thousand samples fill a histogram of its first
tokens). Its drafters are real drafters of each shape (chain MTP, block DFly, tree EAGLE-3) whose
weights are set, not trained, so that their q is exactly the bigram part of the target's p:
softmax(lm_head(final_norm(E[previous token]))). q is then close to p but not equal (the target
reads its context, the drafters do not), so drafts are accepted most of the time and rejected the
rest, and a D-Cut cost table that charges for every verified draft makes D-Cut cut the least
confident ones.

    from tests.ascii_bundle import make_ascii_bundle
    path = make_ascii_bundle(tmp_path / "bundle", drafters=("mtp", "dfly", "eagle3"))
"""

from __future__ import annotations

from pathlib import Path

import torch

from engines.drafters.base import Drafter
from engines.model import ModelConfig, Transformer, init_weights, load_model, save_model
from engines.tokenizer import END, SPECIAL_TOKENS, Tokenizer, save_tokenizer_config

LOGIT_SCALE = 2.0   # the final norm's gain: a larger one makes the target's distributions peakier
CONTEXT = 0.007     # the target's residual branches' scale: larger, the context moves p further from q
DFLY_RESIDUE = 0.05  # the DFly backbone's output scale: the constant its drafts' hidden states carry
GATE = 8.0          # the DFly correction head's constant gate (silu(GATE) ~ GATE: the up branch passes)
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


def make_ascii_bundle(out: Path, drafters: tuple[str, ...] = ("mtp", "dfly", "eagle3"), seed: int = 0) -> Path:
    """The bundle at `out`: the target (float32) and a `bigram_drafter` of each kind in `drafters`."""
    vocab = save_ascii_tokenizer(out)
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=SPECIAL_TOKENS.index(END))
    model = Transformer(cfg)
    init_weights(model, std=0.2)
    with torch.no_grad():
        model.model.norm.weight.fill_(LOGIT_SCALE)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(CONTEXT)
            layer.mlp.down_proj.weight.mul_(CONTEXT)
    save_model(model, out, dtype=torch.float32)
    if drafters:
        from engines.drafters.registry import save_drafter

        target = load_model(out).eval()
        for kind in drafters:
            save_drafter(bigram_drafter(kind, target), out / "drafters" / kind, dtype=torch.float32)
    return out


@torch.no_grad()
def bigram_drafter(kind: str, target: Transformer) -> Drafter:
    """A drafter of `kind` (mtp, eagle3 or dfly) whose draft distribution after token t is the target's
    bigram part, softmax(lm_head(final_norm(E[t]))), over the full vocabulary: its decoder layers'
    residual branches are zero (each layer passes its input through), and

    - mtp, eagle3 (chains; eagle3 drafts a tree of them): `eh_proj` = [I | 0] keeps the token's
      normalised embedding and drops the hidden state, which the target's final norm and LM head read;
    - dfly: the backbone's output norm is scaled down to DFLY_RESIDUE (every mask slot's hidden is
      then that small constant); its correction head's gate is a constant GATE (read from that
      constant hidden state), its up projection the previous token's normalised embedding, and
      `down_proj` scales by LOGIT_SCALE / silu(GATE): slot j's hidden is LOGIT_SCALE x
      norm(E[d_{j-1}]) plus the small constant."""
    from engines.drafters.registry import new_drafter

    d = new_drafter(kind, target)
    for layer in [getattr(d, "layer", None), *getattr(d, "layers", [])]:
        if layer is not None:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    H = target.config.hidden_size
    if kind in ("mtp", "eagle3"):
        d.eh_proj.weight.copy_(torch.cat([torch.eye(H), torch.zeros(H, H)], 1))
        return d
    assert kind == "dfly", kind
    c = d.correction
    inter = c.down_proj.weight.shape[1]
    assert inter == H, "the correction head maps the embedding through identity weights"
    d.norm.weight.fill_(DFLY_RESIDUE)
    mask = d.norm(d.embed(torch.tensor([d.cfg.mask_token_id])))[0]        # every mask slot's hidden [H]
    v = c.h_norm(mask)
    c.h_proj.weight.zero_()
    c.h_proj.weight[:inter] = GATE * v[None] / v.dot(v)                   # gate = GATE in every channel
    c.e_proj.weight.zero_()
    c.e_proj.weight[inter:] = torch.eye(H)                                # up = norm(E[prev])
    c.down_proj.weight.copy_(torch.eye(H) * LOGIT_SCALE / torch.nn.functional.silu(torch.tensor(GATE)))
    return d


def answer_tokens(tok: Tokenizer, text: str, finish_reason: str) -> tuple[int, ...]:
    """An answer's tokens from its text (one token per character or special token's name), the end
    of turn appended where the model stopped."""
    ids = tuple(tok.encode(text))
    return (*ids, tok.eos_id) if finish_reason == "stop" else ids
