"""DFly (AngelSpec "DFlareV2"): DFlash with per-layer fusion of the target layers (as a residual)
plus a predecessor-conditioned correction head.

After the one backbone pass over `[y0, MASK, ...]`, each block slot j's final hidden h_j is corrected
with the embedding of the token before it and only then read by the LM head:

    h'_j = h_j + down(silu(g) * u),   [g ; u] = W_h norm_h(h_j) + W_e norm_e(E[y_{j-1}])

(= SwiGLU over concat(norm(h_j), norm(E[y_{j-1}])) with the gate/up weights split by input half).
`down_proj` starts at zero, so an untrained head is exactly DFlash-with-fusion. Training
teacher-forces y_{j-1}. Drafting runs a cheap loop: the W_h half is computed for all slots at once
and the W_e half is a lookup table over the vocabulary (built lazily, dropped by train()/eval()).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.drafters.base import DraftContext, Proposal
from engines.drafters.config import DraftConfig
from engines.drafters.dflash import DFlashDrafter
from engines.drafters.head import hot_rows
from engines.model import RMSNorm, Transformer
from engines.sampling import RowParam


class Correction(nn.Module):
    def __init__(self, hidden: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.h_norm = RMSNorm(hidden, eps)
        self.e_norm = RMSNorm(hidden, eps)
        self.h_proj = nn.Linear(hidden, 2 * intermediate, bias=False)  # [gate ; up] from h
        self.e_proj = nn.Linear(hidden, 2 * intermediate, bias=False)  # [gate ; up] from E[prev]
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        nn.init.zeros_(self.down_proj.weight)

    def pre(self, h: Tensor) -> Tensor:
        return self.h_proj(self.h_norm(h))

    def forward(self, h: Tensor, pre: Tensor, prev_emb: Tensor) -> Tensor:
        """h [.., H], pre = self.pre(h) [.., 2I], prev_emb [.., H] -> corrected hidden [.., H]."""
        g, u = (pre + self.e_proj(self.e_norm(prev_emb))).chunk(2, dim=-1)
        return h + self.down_proj(F.silu(g) * u)


class DFlyDrafter(DFlashDrafter):
    kind = "dfly"
    objective_note = "correction head teacher-forced"
    conditioned_drafts = True       # slot j reads the draft before it

    @classmethod
    def config_overrides(cls, target: Transformer) -> dict[str, object]:
        """DFlash's, with fusion and a correction head as wide as the target."""
        return {**super().config_overrides(target), "fusion": True,
                "correction_intermediate_size": target.config.hidden_size}

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        if not cfg.fusion or cfg.correction_intermediate_size <= 0:
            raise ValueError("dfly needs fusion=True and correction_intermediate_size > 0")
        super().__init__(target, cfg)
        self.correction = Correction(cfg.hidden_size, cfg.correction_intermediate_size, cfg.rms_norm_eps)
        self._table = None

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.zeros_(self.correction.down_proj.weight)

    def draft_logits(self, h: Tensor, block: Tensor) -> Tensor:
        """Teacher-forced: slot j's predecessor is block token j-1 (ground truth in training)."""
        hs = h[..., 1:, :]
        return self.lm_logits(self.correction(hs, self.correction.pre(hs), self.embed(block[..., :-1])))

    def train(self, mode: bool = True) -> DFlyDrafter:
        self._table: Tensor | None = None  # weights may change: rebuild the lookup table lazily
        super().train(mode)
        return self

    def embedding_table(self) -> Tensor:
        """[V, 2I]: the E[prev] half of gate/up for every token, so the drafting loop only gathers."""
        if getattr(self, "_table", None) is None:
            c = self.correction
            self._table = c.e_proj(c.e_norm(self.target.model.embed_tokens.weight.to(c.e_proj.weight.dtype))).detach()
        assert self._table is not None
        return self._table

    def draft_block(self, ctx: DraftContext, h: Tensor, temperature: RowParam, top_p: RowParam,
                    generator: torch.Generator | None) -> Proposal:
        """h [B, k, H]: each slot's hidden is corrected with the draft before it, then read."""
        B, k = h.shape[:2]
        c, head = self.correction, self.draft_head
        pre = c.pre(h)                               # [B, k, 2I]
        prev = ctx.last_token
        hot = bool(hot_rows(temperature, self.sample_drafts, B).any())
        if hot or ctx.masks is not None:   # greedy rows among sampled ones: pick's one-hot q
            toks, confs, probs = [], [], []
            for j in range(k):
                hj = c(h[:, j], pre[:, j], self.embed(prev))
                allowed = None if ctx.masks is None else ctx.masks.after(prev if j else None)
                prev, conf, p = head.pick(head.logits(hj), temperature, top_p, hot, generator, allowed)
                toks.append(prev)
                confs.append(conf)
                probs.append(p)
            return Proposal(torch.stack(toks, 1), torch.stack(confs, 1),
                            torch.stack(probs, 1) if hot else None)  # type: ignore[arg-type]
        # greedy: per slot one gather, SwiGLU, down_proj, drafting head and argmax. (Solving the
        # recurrence by batched fixed-point passes was tried: the correction head keeps changing later
        # slots, so it needed ~k passes of k slots each and was slower than this loop.)
        table = self.embedding_table()
        I2 = table.shape[1] // 2
        idx = torch.empty(B, k, dtype=torch.long)                          # draft-vocabulary indices
        logits = []
        for j in range(k):
            gu = pre[:, j] + table[prev]                                   # [B, 2I]
            z = head.logits(h[:, j] + c.down_proj(F.silu(gu[:, :I2]) * gu[:, I2:]))   # [B, N]
            idx[:, j] = z.argmax(-1)
            prev = head.tokens(idx[:, j])
            logits.append(z)
        conf = torch.softmax(torch.stack(logits, 1), -1).gather(-1, idx[..., None]).squeeze(-1)
        return Proposal(head.tokens(idx), conf)
