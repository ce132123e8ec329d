"""DFlash block drafter (z-lab): KV injection of fused target features + one non-causal block pass.

Context: the outputs of several target layers (`target_layer_ids`) are concatenated, projected by
`fc` and normalised (`hidden_norm`); every drafter layer projects that context with its own
k_proj/v_proj (the same projections as for block tokens) and caches the roped K/V per position.
With `fusion` (used by DFly) drafter layer i adds a learned softmax blend of the raw target layers as
a residual before the norm: `ctx_i = hidden_norm(fc(cat h) + sum_t softmax(w_i)_t h_t)`.

Drafting: the block `[y0, MASK x (B-1)]` at positions n..n+B-1 attends to the cached context at
positions < n and, non-causally, to itself; slots 1..B-1 are the drafts.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.drafters.config import MASK_TOKEN_ID, DraftConfig, default_target_layers
from engines.drafters.layers import DraftLayer, empty_proposal, write_valid
from engines.model import ForwardOut, KVCache, RMSNorm, Transformer, init_weights, rope_cos_sin
from engines.sampling import RowParam


def fusion_prior(num_layers: int, num_sources: int) -> Tensor:
    """DFlare's distance prior: drafter layer d prefers target layer round(d/(D-1)*(T-1))."""
    w = torch.zeros(num_layers, num_sources)
    for d in range(num_layers):
        t_star = round(d / (num_layers - 1) * (num_sources - 1)) if num_layers > 1 else num_sources - 1
        w[d] = -2.0 * (torch.arange(num_sources) - t_star).abs().float()
    return w


class DFlashDrafter(Drafter):
    kind = "dflash"
    conditioned_drafts = False      # every slot's q is known before any draft is drawn
    objective = "block"

    variant_overrides: ClassVar[dict[str, object]] = {}   # what a variant adds to DFlash's defaults

    @classmethod
    def config_overrides(cls, target: Transformer) -> dict[str, object]:
        """Two layers reading 3 target layers, block 16 (and a variant's `variant_overrides`)."""
        return {"num_layers": 2, "target_layer_ids": default_target_layers(target.config.num_hidden_layers),
                "block_size": 16, "mask_token_id": MASK_TOKEN_ID, **cls.variant_overrides}

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        if cfg.mask_token_id is None or cfg.block_size < 2 or not cfg.target_layer_ids:
            raise ValueError("block drafters need mask_token_id, block_size >= 2 and target_layer_ids")
        super().__init__(target, cfg)
        H, n = cfg.hidden_size, len(cfg.target_layer_ids)
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg.layer_config()) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        if cfg.fusion:
            self.fusion_weights = nn.Parameter(fusion_prior(cfg.num_layers, n))
        self.block_size = cfg.block_size
        self.cache: KVCache | None = None

    def reset_parameters(self) -> None:
        init_weights(self, num_layers=self.cfg.num_layers)
        with torch.no_grad():  # start the output scale where the target's final hidden lives
            self.norm.weight.copy_(self.target.model.norm.weight)
        if self.cfg.fusion:
            with torch.no_grad():
                self.fusion_weights.copy_(fusion_prior(self.cfg.num_layers, len(self.cfg.target_layer_ids)))

    # --- target interface ------------------------------------------------------------------------
    @property
    def capture_layers(self) -> list[int]:
        return list(self.cfg.target_layer_ids)

    def features(self, out: ForwardOut) -> Tensor:
        return torch.cat(out.captured, dim=-1)  # [B, T, n*H]

    @property
    def max_draft(self) -> int:
        return self.block_size - 1

    def set_block_size(self, block_size: int) -> None:
        if block_size < 2:
            raise ValueError(f"{self.kind}: block size must be >= 2, got {block_size}")
        self.block_size = block_size

    def allocate(self, num_slots: int, max_len: int) -> None:
        c = self.cfg
        dtype = next(self.parameters()).dtype
        self.cache = KVCache(c.num_layers, num_slots, max_len, c.num_key_value_heads, c.head_dim, dtype)

    def reset(self, slot: int) -> None:
        if self.cache is not None:
            self.cache.reset(slot)

    # --- the module ------------------------------------------------------------------------------
    def context(self, feats: Tensor) -> list[Tensor]:
        """feats [B, T, n*H] -> per drafter layer context [B, T, H]."""
        base = self.fc(feats)
        if not self.cfg.fusion:
            c = self.hidden_norm(base)
            return [c] * self.cfg.num_layers
        B, T, _ = feats.shape
        hs = feats.view(B, T, len(self.cfg.target_layer_ids), self.cfg.hidden_size)
        w = torch.softmax(self.fusion_weights.float(), dim=-1).to(feats.dtype)  # [D, n]
        return [self.hidden_norm(base + torch.einsum("btnh,n->bth", hs, w[i])) for i in range(self.cfg.num_layers)]

    def context_kv(self, feats: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """feats [B, T, n*H], positions [B, T] -> per layer roped (k, v) [B, T, nkv, hd]."""
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, feats.dtype)
        return [layer.kv(c, cos, sin) for layer, c in zip(self.layers, self.context(feats), strict=True)]

    def backbone(self, block: Tensor, positions: Tensor, ctx_kv: list[tuple[Tensor, Tensor]],
                 mask: Tensor) -> Tensor:
        """block/positions [B, Q]; ctx_kv per layer [B, C, nkv, hd]; mask [B|1, 1, Q|1, C+Q] over the
        keys [context | block] (which context positions and which block tokens each query sees).
        Returns the final-normed hidden [B, Q, H]."""
        x = self.embed(block)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for layer, (ck, cv) in zip(self.layers, ctx_kv, strict=True):
            def kv_fn(k: Tensor, v: Tensor, ck: Tensor = ck, cv: Tensor = cv) -> tuple[Tensor, Tensor, Tensor]:
                return torch.cat([ck.to(k.dtype), k], 1), torch.cat([cv.to(v.dtype), v], 1), mask
            x = layer(x, cos, sin, kv_fn)
        return self.norm(x)

    def draft_logits(self, h: Tensor, block: Tensor) -> Tensor:
        """Training: block-slot hidden [.., Bk, H] and block tokens (teacher-forced) -> logits of slots
        1..Bk-1 [.., Bk-1, V]. DFlash: LM head; DFly adds the correction head."""
        return self.lm_logits(h[..., 1:, :])

    # --- drafting --------------------------------------------------------------------------------
    def ingest(self, ctx: DraftContext) -> None:
        assert self.cache is not None, "call allocate() first"
        feats = ctx.feats.to(next(self.parameters()).dtype)
        for i, (k, v) in enumerate(self.context_kv(feats, ctx.positions)):
            write_valid(self.cache, i, ctx.slots, ctx.positions, ctx.valid, k, v)

    def block_hidden(self, ctx: DraftContext) -> Tensor:
        """Ingest, then one block pass -> final-normed hidden of the block [B, Bk, H]."""
        assert self.cache is not None
        self.ingest(ctx)
        B, Bk = ctx.slots.shape[0], self.block_size
        block = torch.full((B, Bk), int(self.cfg.mask_token_id or 0), dtype=torch.long)
        block[:, 0] = ctx.last_token
        positions = ctx.start[:, None] + torch.arange(Bk)[None]
        upto = int(ctx.start.max())
        ctx_kv = [self.cache.read(i, ctx.slots, upto) for i in range(self.cfg.num_layers)]
        seen = torch.arange(upto)[None] < ctx.start[:, None]                       # [B, C]
        mask = torch.cat([seen, torch.ones(B, Bk, dtype=torch.bool)], 1)[:, None, None, :]  # [B, 1, 1, C+Bk]
        return self.backbone(block, positions, ctx_kv, mask)

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int, temperature: RowParam = 0.0, top_p: RowParam = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        k = min(k, self.max_draft)
        if k <= 0:
            return empty_proposal(ctx.slots.shape[0])
        h = self.block_hidden(ctx)[:, 1:k + 1]                  # [B, k, H]
        return self.draft_block(ctx, h, temperature, top_p, generator)

    def draft_block(self, ctx: DraftContext, h: Tensor, temperature: RowParam, top_p: RowParam,
                    generator: torch.Generator | None) -> Proposal:
        """The drafts from the block pass's hidden of the k draft slots h [B, k, H] (k >= 1; under
        `propose`'s no_grad). Variants that read more than h (the previous draft token) override this."""
        head = self.draft_head
        logits = head.logits(h)                                 # [B, k, N]
        B, k = h.shape[:2]
        t, tp = (x.repeat_interleave(k) if isinstance(x, Tensor) else x for x in (temperature, top_p))  # per row: [B * k]
        tok, conf, probs = head.pick(logits.reshape(B * k, -1), t, tp, self.sample_drafts, generator)
        return Proposal(tok.view(B, k), conf.view(B, k), None if probs is None else probs.view(B, k, -1))
