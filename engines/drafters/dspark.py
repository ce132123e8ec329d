"""DSpark (DeepSeek; AngelSpec `models/draft/dspark.py`): a DFlash backbone pass plus a low-rank Markov
(bigram) logit bias on the previous draft token, and a confidence head for confidence-scheduled
verification.

    logits_j = LMHead(h_j) + W2 W1[y_{j-1}]             W1: Embedding(V, r), W2: Linear(r, V), zero-init
    conf_j   = sigmoid( c([h_j ; W1[y_{j-1}]]) )         estimated P(draft j accepted | drafts < j accepted)

`W2` starts at zero, so an untrained DSpark is exactly DFlash. Training teacher-forces y_{j-1} (the
whole block stays one parallel pass) and fits the confidence head with BCE against whether the slot's
argmax equals the target's token (`objective = "spark"`: the block loss plus that term; the head reads
detached inputs, so it never pulls on the drafter). Drafting runs a cheap loop after the backbone pass:
one r-wide gather and an [N, r] matmul per slot (N = draft vocabulary).

Confidence-scheduled block length: `Proposal.conf` carries conf_j, a calibrated per-position
acceptance estimate instead of the draft's softmax probability (greedy drafting; sampled drafts report
the largest probability of q_j, known before the draft is drawn, as every drafter does). D-Cut (`engines/dcut/`) turns the
prefix products of exactly these numbers and the profiled verify-cost curve into each row's verified
length per step, which is DSpark's "confidence-scheduled verification" (DeepSeek's scheduler and
vLLM's `enable_adaptive_verification` do the same with a capacity curve). Without D-Cut the whole
block is verified.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.drafters.base import DraftContext, Proposal
from engines.drafters.config import DraftConfig
from engines.drafters.dflash import DFlashDrafter
from engines.drafters.head import hot_rows
from engines.model import Transformer
from engines.sampling import RowParam

MARKOV_RANK = 32


class DSparkDrafter(DFlashDrafter):
    kind = "dspark"
    objective = "spark"
    objective_note = "Markov bias teacher-forced; confidence head BCE on acceptance"
    conditioned_drafts = True       # slot j's Markov bias reads the draft before it
    variant_overrides = {"markov_rank": MARKOV_RANK}      # DFlash's defaults with a rank-32 bigram bias

    def __init__(self, target: Transformer, cfg: DraftConfig) -> None:
        if cfg.markov_rank <= 0:
            raise ValueError("dspark needs markov_rank > 0")
        super().__init__(target, cfg)
        V, H, r = cfg.vocab_size, cfg.hidden_size, cfg.markov_rank
        self.markov_in = nn.Embedding(V, r)                  # W1
        self.markov_out = nn.Linear(r, V, bias=False)        # W2
        self.confidence = nn.Linear(H + r, 1)
        nn.init.zeros_(self.markov_out.weight)
        self.conf_logits: Tensor | None = None               # training: last draft_logits' conf logits
        self._rows: tuple[object, Tensor] | None = None      # (drafting head, its W2 rows)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.normal_(self.markov_in.weight, std=0.02)
        nn.init.zeros_(self.markov_out.weight)
        nn.init.zeros_(self.confidence.weight)
        nn.init.zeros_(self.confidence.bias)

    def train(self, mode: bool = True) -> DSparkDrafter:
        self._rows = None            # weights may change: rebuild the drafting rows lazily
        super().train(mode)
        return self

    def draft_logits(self, h: Tensor, block: Tensor) -> Tensor:
        """Teacher-forced: slot j's predecessor is block token j-1. Also leaves the confidence logits
        of the same slots in `self.conf_logits` [.., Bk-1] for the objective."""
        hs, e = h[..., 1:, :], self.markov_in(block[..., :-1])          # [.., Bk-1, H], [.., Bk-1, r]
        self.conf_logits = self.confidence(torch.cat([hs, e], -1).detach()).squeeze(-1)
        return self.lm_logits(hs) + self.vocab_rows(self.markov_out, e).float()

    def markov_rows(self) -> Tensor:
        """W2 restricted to the draft vocabulary, in the drafting head's dtype: [N, r] (rebuilt whenever
        the drafting head is)."""
        head = self.draft_head
        if self._rows is None or self._rows[0] is not head:
            w = self.markov_out.weight if head.ids is None else self.markov_out.weight[head.ids]
            self._rows = (head, w.detach().to(head.weight.dtype).contiguous())
        return self._rows[1]

    def draft_block(self, ctx: DraftContext, h: Tensor, temperature: RowParam, top_p: RowParam,
                    generator: torch.Generator | None) -> Proposal:
        """h [B, k, H]: each slot's logits get the Markov bias of the draft before it."""
        B, k = h.shape[:2]
        head, rows = self.draft_head, self.markov_rows()
        base = head.logits(h)                                    # [B, k, N] fp32
        hot = hot_rows(temperature, self.sample_drafts, B)      # [B] rows whose drafts are sampled
        sampling = bool(hot.any())
        prev = ctx.last_token
        toks, confs, probs = [], [], []
        for j in range(k):
            e = self.markov_in(prev)                             # [B, r]
            z = base[:, j] + F.linear(e.to(rows.dtype), rows).float()
            allowed = None if ctx.masks is None else ctx.masks.after(prev if j else None)
            prev, c, p = head.pick(z, temperature, top_p, sampling, generator, allowed)
            if not bool(hot.all()):   # the head was fitted to greedy acceptance; sampled drafts keep max q
                c = torch.where(hot, c, torch.sigmoid(self.confidence(torch.cat([h[:, j], e.to(h.dtype)], -1)).float()[:, 0]))
            toks.append(prev)
            confs.append(c)
            probs.append(p)
        return Proposal(torch.stack(toks, 1), torch.stack(confs, 1),
                        torch.stack(probs, 1) if sampling else None)  # type: ignore[arg-type]
