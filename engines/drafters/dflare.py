"""DFlare (AngelSpec `models/draft/dflare.py`): the DFlash block drafter with un-collapsed target layers.

Where DFlash concatenates the captured target layers and projects them once (`fc`) into one context
shared by every drafter layer, DFlare keeps them apart and gives each drafter layer i its own blend

    ctx_i = norm_i( sum_t softmax(w_i)_t h_t )          w in R^{D x T}, distance-prior init

and its own context projections `ctx_k[i]`, `ctx_v[i]` (block tokens keep the layer's k_proj/v_proj),
so the context keys/values are no longer tied to the block's. Drafting and training are DFlash's: one
non-causal pass over `[y0, MASK x (B-1)]` that attends to the cached context K/V (`objective = "block"`).

Shapes: B rows, T positions, n captured target layers, H hidden, nkv/hd key-value heads/head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engines.drafters.config import DraftConfig
from engines.drafters.dflash import DFlashDrafter
from engines.model import RMSNorm, Transformer, apply_rope, rope_cos_sin


class DFlareDrafter(DFlashDrafter):
    kind = "dflare"
    objective_note = "per-layer softmax mix of the target layers, own context K/V projections"
    variant_overrides = {"fusion": True}      # DFlash's defaults with per-layer fusion

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        if not cfg.fusion:
            raise ValueError("dflare needs fusion=True (per-layer mixing of the target layers)")
        super().__init__(target, cfg)
        del self.fc, self.hidden_norm          # no shared context projection: one blend per layer
        H, D, kv = cfg.hidden_size, cfg.num_layers, cfg.num_key_value_heads * cfg.head_dim
        self.ctx_norms = nn.ModuleList(RMSNorm(H, cfg.rms_norm_eps) for _ in range(D))
        self.ctx_k = nn.ModuleList(nn.Linear(H, kv, bias=False) for _ in range(D))
        self.ctx_v = nn.ModuleList(nn.Linear(H, kv, bias=False) for _ in range(D))

    def context(self, feats: Tensor) -> list[Tensor]:
        """feats [B, T, n*H] -> per drafter layer ctx_i = norm_i(softmax-blend of the n layers) [B, T, H]."""
        B, T, _ = feats.shape
        hs = feats.view(B, T, len(self.cfg.target_layer_ids), self.cfg.hidden_size)
        w = torch.softmax(self.fusion_weights.float(), dim=-1).to(feats.dtype)    # [D, n]
        return [norm(torch.einsum("btnh,n->bth", hs, w[i])) for i, norm in enumerate(self.ctx_norms)]

    def context_kv(self, feats: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """feats [B, T, n*H], positions [B, T] -> per layer roped (k, v) [B, T, nkv, hd] through the
        layer's own context projections."""
        B, T, _ = feats.shape
        nkv, hd = self.cfg.num_key_value_heads, self.cfg.head_dim
        cos, sin = rope_cos_sin(positions, hd, self.cfg.rope_theta, feats.dtype)
        out = []
        for c, kp, vp in zip(self.context(feats), self.ctx_k, self.ctx_v, strict=True):
            k = apply_rope(kp(c).view(B, T, nkv, hd).transpose(1, 2), cos, sin).transpose(1, 2)
            out.append((k, vp(c).view(B, T, nkv, hd)))
        return out
