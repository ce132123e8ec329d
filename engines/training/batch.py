"""The drafters' training data: the cached self-distillation sets, and padded batches of them.

A batch holds what the drafter itself would read at inference: `drafter.features()` applied to the
cached target forward (final hidden and captured layers) of each sequence, so every kind trains on
its own feature source; and the target's final hidden state (`teacher`), from which the soft-target
losses compute the target's next-token distribution at every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engines.drafters.base import Drafter
from engines.drafters.config import target_fingerprint
from engines.model import ForwardOut, Transformer
from engines.precision import bf16_is_native
from engines.tokenizer import Tokenizer
from engines.training.data import DOMAINS
from engines.training.distill import (
    DistillSet,
    Features,
    build_set,
    cached_chunks,
    cached_data,
    concat,
    forward_features,
    pick_prompts,
    pick_references,
    reference_set,
    set_key,
)
from engines.training.recipe import DrafterPreset
from specroute.errors import UserError


@dataclass
class Batch:
    tokens: Tensor       # [B, S]
    feats: Tensor        # [B, S, F] the drafter's features of each position
    lengths: Tensor      # [B]
    prompt_lens: Tensor  # [B]
    teacher: Tensor | None = None   # [B, S, H] target's final hidden: row j -> p(x_{j+1} | x_<=j)


def bucketed_batch(lengths: Sequence[int], batch_size: int, gen: torch.Generator, bucket: int = 4) -> list[int]:
    """`batch_size` sequence indices drawn from one length bucket: the sequences sorted by length and cut
    into runs of `bucket * batch_size` (the last run takes the remainder). The bucket is the one of a
    uniformly drawn sequence and members are drawn uniformly within it, so every sequence is drawn as
    often as under uniform sampling, while a batch pads only to the longest of similar lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    size = max(1, min(len(order), bucket * batch_size))
    n_buckets = max(1, len(order) // size)
    rank = order.index(int(torch.randint(0, len(order), (1,), generator=gen)))
    b = min(rank // size, n_buckets - 1)
    members = order[b * size:] if b == n_buckets - 1 else order[b * size:(b + 1) * size]
    pick = torch.randint(0, len(members), (batch_size,), generator=gen).tolist()
    return [members[j] for j in pick]


def cached_forward(feats: Features, i: int, capture: Sequence[int]) -> ForwardOut:
    """Sequence i's target forward as cached ([1, T, H] each), capturing the layers `capture`."""
    rows = feats.rows(i)
    layers = feats.captured[rows].split(feats.final.shape[1], dim=-1)
    missing = [layer for layer in capture if layer not in feats.layers]
    if missing:
        raise UserError(f"the drafter reads target layers {missing}, not among the cached {feats.layers}")
    return ForwardOut(feats.final[rows][None], [layers[feats.layers.index(layer)][None] for layer in capture])


def make_batch(data: DistillSet, feats: Features, idx: list[int], drafter: Drafter, teacher: bool = False) -> Batch:
    """Sequences `idx` padded to the longest; with `teacher`, also their final hidden states."""
    lens = [len(data.tokens[i]) for i in idx]
    S = max(lens)
    rows = [drafter.features(cached_forward(feats, i, drafter.capture_layers))[0] for i in idx]  # [T, F] each
    tokens = torch.zeros(len(idx), S, dtype=torch.long)
    out = torch.zeros(len(idx), S, rows[0].shape[-1])
    final = torch.zeros(len(idx), S, feats.final.shape[1]) if teacher else None
    for r, i in enumerate(idx):
        tokens[r, :lens[r]] = torch.tensor(data.tokens[i])
        out[r, :lens[r]] = rows[r].float()
        if final is not None:
            final[r, :lens[r]] = feats.final[feats.rows(i)].float()
    return Batch(tokens, out, torch.tensor(lens), torch.tensor([data.prompt_lens[i] for i in idx]), final)


def prepare_data(target: Transformer, tok: Tokenizer, p: DrafterPreset, work: Path, layers: list[int],
                 store: Path | None = None) -> tuple[DistillSet, Features, DistillSet, Features]:
    """Train and held-out sets with their features (`layers` captured), cached under `work`. The train
    set is the greedy answers to the train prompts plus, for the first `sampled_fraction` of each
    domain's prompts, answers sampled at `sampled_temperature` (cached apart, so the greedy set is
    shared by recipes that differ only in the mix). The held-out set stays greedy (T=0 reporting).
    With `store` (the recipe's `keep_data`: the bundle's `selfdistill/`), the train set's token
    sequences are kept there too, so a fresh machine recomputes only their features. With
    `reference_per_domain`, that many reference answers per domain (train prompts' and the corpus
    conversations', `distill.pick_references`) are read by the target teacher-forced
    (`distill.reference_set`): more text for one forward each."""
    fp = target_fingerprint(target)
    gen_bf16 = p.gen_bf16 and bf16_is_native()   # emulated bf16 (AVX2) is slower than fp32
    key = set_key(fp, p.max_prompt, p.max_new, p.seed, layers)   # what every cached part shares
    prompts = pick_prompts("train", p.per_domain, p.seed)
    by_domain = {d: [q for q in prompts if q.domain == d] for d in DOMAINS}

    def greedy(chunk: list, domain: str, start: int) -> tuple[DistillSet, Features]:
        return build_set(target, tok, chunk, p.max_prompt, p.max_new, p.gen_batch, layers,
                         f"self-distill ({domain} train prompts from {start})", bf16=gen_bf16)

    def refeature(data: DistillSet) -> Features:
        return forward_features(target, data, layers, gen_bf16)

    parts = [cached_chunks(work / f"selfdistill_{key}", by_domain, p.gen_chunk, greedy, refeature, store)]
    n_sampled = round(p.sampled_fraction * p.per_domain)
    if n_sampled:
        some = {d: qs[:n_sampled] for d, qs in by_domain.items()}
        skey = set_key(key, p.sampled_temperature)

        def sampled(chunk: list, domain: str, start: int) -> tuple[DistillSet, Features]:
            return build_set(target, tok, chunk, p.max_prompt, p.max_new, p.gen_batch, layers,
                             f"self-distill ({domain} train prompts from {start}, sampled at "
                             f"T={p.sampled_temperature:g})", p.sampled_temperature, p.seed + start, gen_bf16)

        parts.append(cached_chunks(work / f"selfdistill_sampled_{skey}", some, p.gen_chunk, sampled, refeature,
                                   store))
    if p.reference_per_domain:
        refs = pick_references(p.reference_per_domain, p.seed)
        rkey = set_key(fp, p.max_prompt, p.max_new, p.seed, layers, "reference")

        def reference(chunk: list, domain: str, start: int) -> tuple[DistillSet, Features]:
            data = reference_set(tok, chunk, p.max_prompt, p.max_new)
            return data, refeature(data)

        parts.append(cached_chunks(work / f"reference_{rkey}", {d: [q for q in refs if q.domain == d] for d in DOMAINS},
                                   p.gen_chunk, reference, refeature))
    train, train_f = concat(parts)
    hkey = set_key(fp, p.heldout_per_domain, p.max_prompt, p.max_new, p.seed, layers)
    held, held_f = cached_data(work / f"heldout_{hkey}", lambda: build_set(
        target, tok, pick_prompts("heldout", p.heldout_per_domain, p.seed), p.max_prompt, p.max_new,
        p.gen_batch, layers, "responses (held-out prompts, eval only)", bf16=False))
    return train, train_f, held, held_f
