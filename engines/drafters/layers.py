"""Building blocks shared by the drafters: a decoder layer whose attention takes its keys/values from
the caller (positional cache, injected context, TTT step caches), and small tensor helpers for
ragged batches.

Shapes: B rows, T tokens per row, H hidden size, L cache length, nkv/hd key-value heads/head dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from engines.drafters.base import Proposal
from engines.model import DecoderLayer, KVCache, Transformer

# kv_fn(k_new, v_new) -> (keys [B, L, nkv, hd], values [B, L, nkv, hd], mask [B|1, 1, T, L])
KVFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class DraftLayer(DecoderLayer):
    """The target's pre-norm decoder layer (same parameters), except that its attention gets the full
    key/value set and mask from `kv_fn`, given the K/V of its own tokens."""

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, H] (already normalised) -> roped k, v [B, T, nkv, hd]."""
        return self.self_attn.kv(x, cos, sin)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv_fn: KVFn) -> Tensor:  # type: ignore[override]
        """x [B, T, H] -> [B, T, H]; kv_fn supplies the keys/values/mask the block attends to."""
        a = self.self_attn
        h = self.input_layernorm(x)
        keys, values, mask = kv_fn(*a.kv(h, cos, sin))
        x = x + a.attend(a.query(h, cos, sin), keys, values, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def write_valid(cache: KVCache, layer: int, slots: Tensor, positions: Tensor, valid: Tensor,
                k: Tensor, v: Tensor) -> None:
    """Write only the valid entries: slots [B], positions/valid [B, T], k/v [B, T, nkv, hd].
    (Padding may carry positions past the end of the cache; it is never stored.)"""
    rows = slots[:, None].expand_as(positions)[valid]
    pos = positions[valid]
    cache.k[layer, rows, pos] = k[valid].to(cache.k.dtype)
    cache.v[layer, rows, pos] = v[valid].to(cache.v.dtype)


def last_valid_index(valid: Tensor) -> Tensor:
    """valid [B, T] (a valid prefix per row, at least one) -> index of the last valid entry [B]."""
    n = valid.sum(1)
    if bool((n == 0).any()):
        raise ValueError("every row of a DraftContext needs at least one newly committed position")
    return n - 1


def freeze(target: Transformer) -> None:
    for p in target.parameters():
        p.requires_grad_(False)


def empty_proposal(batch: int) -> Proposal:
    return Proposal(torch.zeros(batch, 0, dtype=torch.long), torch.zeros(batch, 0))
