"""The drafters' training data: the cached self-distillation sets, and padded batches of them.

A batch holds what the drafter itself would read at inference: `drafter.features()` applied to the
cached target forward (final hidden and captured layers) of each sequence, so every kind trains on
its own feature source.
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
from engines.tokenizer import Tokenizer
from engines.training.distill import DistillSet, Features, build_set, cached_data, pick_prompts, set_key
from engines.training.recipe import DrafterPreset
from specroute.errors import UserError


@dataclass
class Batch:
    tokens: Tensor       # [B, S]
    feats: Tensor        # [B, S, F] the drafter's features of each position
    lengths: Tensor      # [B]
    prompt_lens: Tensor  # [B]


def cached_forward(feats: Features, i: int, capture: Sequence[int]) -> ForwardOut:
    """Sequence i's target forward as cached ([1, T, H] each), capturing the layers `capture`."""
    rows = feats.rows(i)
    layers = feats.captured[rows].split(feats.final.shape[1], dim=-1)
    missing = [layer for layer in capture if layer not in feats.layers]
    if missing:
        raise UserError(f"the drafter reads target layers {missing}, not among the cached {feats.layers}")
    return ForwardOut(feats.final[rows][None], [layers[feats.layers.index(layer)][None] for layer in capture])


def make_batch(data: DistillSet, feats: Features, idx: list[int], drafter: Drafter) -> Batch:
    lens = [len(data.tokens[i]) for i in idx]
    S = max(lens)
    rows = [drafter.features(cached_forward(feats, i, drafter.capture_layers))[0] for i in idx]  # [T, F] each
    tokens = torch.zeros(len(idx), S, dtype=torch.long)
    out = torch.zeros(len(idx), S, rows[0].shape[-1])
    for r, i in enumerate(idx):
        tokens[r, :lens[r]] = torch.tensor(data.tokens[i])
        out[r, :lens[r]] = rows[r].float()
    return Batch(tokens, out, torch.tensor(lens), torch.tensor([data.prompt_lens[i] for i in idx]))


def prepare_data(target: Transformer, tok: Tokenizer, p: DrafterPreset, work: Path, layers: list[int]
                 ) -> tuple[DistillSet, Features, DistillSet, Features]:
    """Train and held-out sets with their features (`layers` captured), cached under `work`."""
    fp = target_fingerprint(target)
    key = set_key(fp, p.per_domain, p.max_prompt, p.max_new, p.seed, layers)
    train, train_f = cached_data(work / f"selfdistill_{key}", lambda: build_set(
        target, tok, pick_prompts("train", p.per_domain, p.seed), p.max_prompt, p.max_new, p.gen_batch,
        layers, "self-distill (train prompts)"))
    hkey = set_key(fp, p.heldout_per_domain, p.max_prompt, p.max_new, p.seed, layers)
    held, held_f = cached_data(work / f"heldout_{hkey}", lambda: build_set(
        target, tok, pick_prompts("heldout", p.heldout_per_domain, p.seed), p.max_prompt, p.max_new,
        p.gen_batch, layers, "responses (held-out prompts, eval only)"))
    return train, train_f, held, held_f
