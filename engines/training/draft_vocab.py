"""Draft vocabularies: the tokens drafters may propose, chosen from the target's own outputs.

`specroute train draft-vocab --out BUNDLE --size N` has the target answer TRAIN prompts (greedy,
balanced chat/code/math), counts the response tokens, keeps the N most frequent (EOS and the chat
special tokens always included) and stores them in every drafter of the bundle (`draft_vocab` in its
`model.safetensors`, `draft_vocab_size` in its `config.json`). The drafter weights are unchanged.
Coverage (the share of the target's response tokens on HELD-OUT prompts inside the set) is reported
for several sizes and written to `drafters/draft_vocab.json`; it bounds how often a restricted head
can still draft the target's token. Training a drafter (`specroute train <kind>`) applies the same
rule to its self-distillation data.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from engines.drafters.head import draft_vocab_from_counts
from engines.model import Transformer
from engines.tokenizer import Tokenizer
from engines.training.distill import DistillSet, greedy_responses, pick_prompts
from specroute.errors import UserError

SIZES = (1024, 2048, 3072, 4096)


def response_counts(data: DistillSet, vocab_size: int) -> Tensor:
    """Token counts [V] over the response part of every sequence."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for toks, p in zip(data.tokens, data.prompt_lens, strict=True):
        if len(toks) > p:
            counts += torch.bincount(torch.tensor(toks[p:]), minlength=vocab_size)
    return counts


def coverage(ids: Tensor, counts: Tensor) -> float:
    """Share of the counted tokens whose id is in `ids`."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 1.0


def always_ids(tok: Tokenizer, target: Transformer) -> list[int]:
    """Tokens every draft vocabulary keeps: EOS ids and the special tokens."""
    return sorted(set(target.config.eos_ids) | set(tok.special_ids()))


def vocab_for(data: DistillSet, tok: Tokenizer, target: Transformer, size: int) -> Tensor:
    return draft_vocab_from_counts(response_counts(data, target.config.vocab_size), size, always_ids(tok, target))


def _responses(target: Transformer, tok: Tokenizer, split: str, per_domain: int, max_new: int,
               seed: int) -> DistillSet:
    prompts = pick_prompts(split, per_domain, seed)
    enc = tok.encode_batch([tok.format_chat([{"role": "user", "content": p.prompt}])
                            for p in prompts])
    keep = [(p, e) for p, e in zip(prompts, enc, strict=True) if 0 < len(e) <= 320]
    resp, _ = greedy_responses(target, [e for _, e in keep], max_new, set(target.config.eos_ids) | {tok.eos_id},
                               64, None, f"responses ({split})")
    return DistillSet(ids=[p.id for p, _ in keep], domains=[p.domain for p, _ in keep],
                      prompt_lens=[len(e) for _, e in keep], tokens=[e + r for (_, e), r in zip(keep, resp, strict=True)])


def build_draft_vocab(bundle: Path, size: int, per_domain: int = 100, heldout_per_domain: int = 40,
                      max_new: int = 128, seed: int = 1234, kinds: Sequence[str] | None = None) -> dict:
    """Choose the draft vocabulary for `bundle`'s target and store it in its drafters."""
    from engines.drafters.registry import DRAFTERS, load_drafter, save_drafter
    from engines.model import load_model

    target = load_model(bundle)
    tok = Tokenizer.load(bundle)
    V = target.config.vocab_size
    if not 0 < size <= V:
        raise UserError(f"--size must be in 1..{V} (the vocabulary), got {size}")
    train = _responses(target, tok, "train", per_domain, max_new, seed)
    held = _responses(target, tok, "heldout", heldout_per_domain, max_new, seed)
    counts, held_counts = response_counts(train, V), response_counts(held, V)
    keep = always_ids(tok, target)
    ids = draft_vocab_from_counts(counts, size, keep)
    report = {
        "size": int(ids.numel()), "vocab_size": V,
        "source": f"target's greedy responses to {len(train)} train prompts ({train.response_tokens()} tokens)",
        "heldout_coverage": round(coverage(ids, held_counts), 4),
        "heldout_coverage_by_size": {str(n): round(coverage(draft_vocab_from_counts(counts, n, keep), held_counts), 4)
                                     for n in sorted({*SIZES, size}) if n <= V},
        "heldout_tokens": int(held_counts.sum()),
        "drafters": [],
    }
    for kind in kinds or list(DRAFTERS):
        if not (bundle / "drafters" / kind / "config.json").is_file():
            continue
        d = load_drafter(kind, bundle, target, head_dtype=None)
        d.set_draft_vocab(ids)
        save_drafter(d, bundle / "drafters" / kind)
        report["drafters"].append(kind)
    if not report["drafters"]:
        raise UserError(f"no drafters under {bundle}/drafters/ (train them first)")
    (bundle / "drafters" / "draft_vocab.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
