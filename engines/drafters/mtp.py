"""MTP drafter (DeepSeek-V3 style), chained k times.

One module: `x = eh_proj([enorm(E[t]) ; hnorm(h)])`, one decoder layer with its own positional KV
cache, then the target's final norm and LM head (both shared and frozen).

Cache convention: the entry at position i is built from (h_i, x_{i+1}) -- the target's hidden state
at i and the token after it -- and predicts x_{i+2}. `propose` first ingests the newly committed
positions; the output at the last one (position n-1, token y0 = x_n) gives d_1. The chain then
writes speculative entries at n, n+1, ... from (own output at the previous position, own draft);
the next call's ingest overwrites them with committed entries.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.drafters.config import DraftConfig
from engines.drafters.layers import (
    DraftLayer,
    KVFn,
    empty_proposal,
    last_valid_index,
    write_valid,
)
from engines.model import ForwardOut, KVCache, RMSNorm, Transformer, causal_mask, init_weights, rope_cos_sin
from engines.sampling import RowParam

CACHE_SLACK = 64  # room for speculative chain entries past the target's max length


class MTPDrafter(Drafter):
    kind = "mtp"
    autoregressive = True
    objective = "chain"

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        super().__init__(target, cfg)
        H = cfg.hidden_size
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.layer = DraftLayer(cfg.layer_config())
        self.cache: KVCache | None = None
        self.last_out = torch.zeros(0)

    def reset_parameters(self) -> None:
        init_weights(self, num_layers=1)

    # --- target interface ------------------------------------------------------------------------
    def features(self, out: ForwardOut) -> Tensor:
        return out.hidden  # [B, T, H] post-final-norm (what the LM head reads)

    @property
    def max_draft(self) -> int:
        return self.cfg.num_draft

    def allocate(self, num_slots: int, max_len: int) -> None:
        c = self.cfg
        dtype = next(self.parameters()).dtype
        self.cache = KVCache(1, num_slots, max_len + CACHE_SLACK, c.num_key_value_heads, c.head_dim, dtype)
        self.last_out = torch.zeros(num_slots, c.hidden_size, dtype=dtype)  # output at n-1 per slot

    def reset(self, slot: int) -> None:
        if self.cache is not None:
            self.cache.reset(slot)

    # --- the module ------------------------------------------------------------------------------
    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor, kv_fn: KVFn) -> Tensor:
        """hidden [B, T, H], tokens/positions [B, T] -> MTP output (pre-final-norm) [B, T, H]."""
        x = self.eh_proj(torch.cat([self.enorm(self.embed(tokens)), self.hnorm(hidden)], dim=-1))
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        return self.layer(x, cos, sin, kv_fn)

    def head(self, out: Tensor) -> Tensor:
        """MTP output -> logits (target's final norm and LM head) [.., V] fp32."""
        return self.lm_logits(self.target.model.norm(out))

    def _cache_kv(self, slots: Tensor, positions: Tensor, valid: Tensor) -> KVFn:
        cache = self.cache
        assert cache is not None, "call allocate() first"

        def kv_fn(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            write_valid(cache, 0, slots, positions, valid, k, v)
            upto = int(positions[valid].max()) + 1
            keys, values = cache.read(0, slots, upto)
            k_pos = torch.arange(upto, device=positions.device).expand(len(slots), upto)
            return keys, values, causal_mask(positions, k_pos)

        return kv_fn

    # --- drafting --------------------------------------------------------------------------------
    def ingest(self, ctx: DraftContext) -> Tensor:
        """Write the newly committed entries into the cache -> each row's output at n-1 [B, H] (the
        one that predicts d_1; a row re-drafted without new context reuses its stored output)."""
        feats = ctx.feats.to(next(self.parameters()).dtype)
        fresh = ctx.valid.any(1)                     # rows with newly committed positions
        if bool(fresh.any()):
            out = self.step(feats, ctx.next_tokens, ctx.positions,
                            self._cache_kv(ctx.slots, ctx.positions, ctx.valid))
            last = last_valid_index(ctx.valid[fresh])
            self.last_out[ctx.slots[fresh]] = out[fresh][torch.arange(len(last)), last]
        return self.last_out[ctx.slots]

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int, temperature: RowParam = 0.0, top_p: RowParam = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        B = ctx.slots.shape[0]
        if k <= 0:
            return empty_proposal(B)
        h = self.ingest(ctx)[:, None]                # [B, 1, H] output at position n-1
        pos = (ctx.start - 1)[:, None]               # [B, 1]
        toks, confs, probs = [], [], []
        ones = torch.ones(B, 1, dtype=torch.bool)
        head, norm = self.draft_head, self.target.model.norm
        for s in range(k):
            if s:
                pos = pos + 1
                h = self.step(h, toks[-1][:, None], pos, self._cache_kv(ctx.slots, pos, ones))
            allowed = None if ctx.masks is None else ctx.masks.after(toks[-1] if s else None)
            t, c, p = head.pick(head.logits(norm(h[:, 0])), temperature, top_p, self.sample_drafts, generator, allowed)
            toks.append(t)
            confs.append(c)
            probs.append(p)
        return Proposal(torch.stack(toks, 1), torch.stack(confs, 1),
                        torch.stack(probs, 1) if probs[0] is not None else None)  # type: ignore[arg-type]
