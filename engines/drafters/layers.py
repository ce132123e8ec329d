"""Building blocks shared by the drafters: the config schema, a decoder layer whose attention takes
its keys/values from the caller (positional cache, injected context, TTT step caches), and small
tensor helpers for ragged batches.

Shapes: B rows, T tokens per row, H hidden size, L cache length, nkv/hd key-value heads/head dim.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from engines.drafters.base import Proposal
from engines.model import MLP, Attention, KVCache, ModelConfig, RMSNorm, Transformer, apply_rope

DrafterKind = Literal["mtp", "dflash", "dfly"]


def build_target_layer_ids(num_target_layers: int, n: int) -> list[int]:
    """Target decoder layers read by block drafters (z-lab's rule): evenly spaced in [1, L-3].
    L=12, n=3 -> [1, 5, 9]; n=1 -> [L//2]."""
    if n == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (n - 1)) for i in range(n)]


def target_fingerprint(target: Transformer) -> str:
    """Short hash of the target's (bf16-rounded) embedding: drafters are trained for one target."""
    w = target.model.embed_tokens.weight.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy()
    return hashlib.sha256(w.tobytes()).hexdigest()[:16]


class DraftConfig(BaseModel):
    """`drafters/<kind>/config.json`."""

    model_config = ConfigDict(extra="forbid")

    kind: DrafterKind
    hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    target_num_hidden_layers: int = Field(ge=1)
    target_layer_ids: list[int] = Field(default_factory=list)   # block drafters: captured target layers
    block_size: int = 0                                          # block drafters: default block (B)
    mask_token_id: int | None = None                             # block drafters: <|mask|>
    num_draft: int = 3                                           # mtp: default chain length k
    fusion: bool = False                                         # per-layer blend of target layers (dfly)
    correction_intermediate_size: int = 0                       # dfly: correction head width (0 = none)
    draft_vocab_size: int = Field(default=0, ge=0)               # drafting head rows (0 = full vocabulary)
    target_fingerprint: str | None = None
    torch_dtype: str = "bfloat16"

    def layer_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# kv_fn(k_new, v_new) -> (keys [B, L, nkv, hd], values [B, L, nkv, hd], mask [B|1, 1, T, L])
KVFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class DraftLayer(nn.Module):
    """Pre-norm decoder layer (same parameter names as `engines.model.DecoderLayer`) whose attention
    gets its full key/value set and mask from `kv_fn`, given the K/V of its own tokens."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, H] (already normalised) -> roped k, v [B, T, nkv, hd]."""
        a = self.self_attn
        B, T, _ = x.shape
        k = a.k_proj(x).view(B, T, a.nkv, a.hd).transpose(1, 2)
        k = apply_rope(k, cos, sin).transpose(1, 2)
        return k, a.v_proj(x).view(B, T, a.nkv, a.hd)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv_fn: KVFn) -> Tensor:
        a = self.self_attn
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = apply_rope(a.q_proj(h).view(B, T, a.nh, a.hd).transpose(1, 2), cos, sin)  # [B, nh, T, hd]
        k, v = self.kv(h, cos, sin)
        keys, values, mask = kv_fn(k, v)
        out = F.scaled_dot_product_attention(
            q, keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype),
            attn_mask=mask, enable_gqa=a.nh != a.nkv,
        )  # [B, nh, T, hd]
        x = x + a.o_proj(out.transpose(1, 2).reshape(B, T, a.nh * a.hd))
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
