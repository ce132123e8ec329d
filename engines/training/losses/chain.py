"""Chain drafters (MTP; `objective = "chain"`): training-time test over `ttt_steps` unrolled chain
steps. Step 0 is teacher-forced, later steps on-policy (own argmax and own output hidden, as at
inference); attention over the step caches follows the inference chain exactly; step weights
`ttt_decay**s`; scored on response positions only.

A chain drafter provides `step(hidden, tokens, positions, kv_fn)` (one chain step for every position
at once, attending through `kv_fn`) and `head(out)` (its output -> logits).
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.drafters.base import Drafter
from engines.drafters.layers import KVFn
from engines.training.batch import Batch
from engines.training.losses.base import Objective, StepOut
from engines.training.losses.soft import (
    METRIC_TEMPERATURE,
    Soft,
    expected_acceptance,
    soft_loss,
    teacher_logits,
)
from engines.training.recipe import DrafterPreset, describe_soft


class ChainDrafter(Protocol):
    def step(self, hidden: Tensor, tokens: Tensor, positions: Tensor, kv_fn: KVFn) -> Tensor: ...
    def head(self, out: Tensor) -> Tensor: ...
    def lm_logits(self, hidden: Tensor) -> Tensor: ...
    def vocab_index(self, tokens: Tensor) -> Tensor: ...
    def vocab_token(self, index: Tensor) -> Tensor: ...


def masked_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labels that are not -100 (a token outside the training
    vocabulary); 0 when there are none."""
    n = (labels != -100).sum()
    return F.cross_entropy(logits, labels, reduction="sum") / n.clamp(min=1)


def ttt_mask(P: int, s: int) -> Tensor:
    """Keys [step 0 | step 1 | ... | step s] for queries of step s at positions p (chain start p-s):
    step-0 entries at positions <= p-s (the committed prefix) and the chain's own step-j entry at
    position p-s+j. -> [1, 1, P, (s+1)P]."""
    q = torch.arange(P)[:, None]
    i = torch.arange(P)[None, :]
    blocks = [i <= q - s] + [i == q - s + j for j in range(1, s + 1)]
    return torch.cat(blocks, dim=1)[None, None]


def chain_loss(d: ChainDrafter, b: Batch, steps: int, decay: float, on_policy: bool = True,
               soft: Soft | None = None) -> StepOut:
    B, S = b.tokens.shape
    P = S - 2
    pos = torch.arange(P).expand(B, P)
    labels = b.tokens[:, 2:]                                  # position p predicts x_{p+2}
    p_idx = torch.arange(P)[None]
    h_in, t_in = b.feats[:, :P], b.tokens[:, 1:P + 1]         # entry p = (h_p, x_{p+1})
    keys: list[Tensor] = []
    values: list[Tensor] = []
    total = torch.zeros(())
    wsum = 0.0
    corrects, valids, preds, accepts = [], [], [], []
    if soft is not None and b.teacher is None:
        raise ValueError("a soft objective needs the batch's teacher (make_batch(..., teacher=True))")
    # later steps score a subset of step 0's positions: the teacher's logits are computed once
    valid0 = (p_idx >= b.prompt_lens[:, None] - 1) & (p_idx + 2 < b.lengths[:, None])
    teach = teacher_logits(d.lm_logits, b.teacher[:, 1:P + 1][valid0]) if b.teacher is not None else None
    for s in range(steps):
        def kv_fn(k: Tensor, v: Tensor, s: int = s) -> tuple[Tensor, Tensor, Tensor]:
            keys.append(k)
            values.append(v)
            return torch.cat(keys, 1), torch.cat(values, 1), ttt_mask(P, s)
        out = d.step(h_in, t_in, pos, kv_fn)                   # [B, P, H]
        # chain start c = p - s must be at or after the last prompt position (first drafted call);
        # the LM head only runs where a label is scored (these are also the only predictions the
        # next on-policy step reads)
        valid = (p_idx - s >= b.prompt_lens[:, None] - 1) & (p_idx + 2 < b.lengths[:, None])
        logits = d.head(out[valid])                           # [N, V] fp32 ([N, N'] over a training vocabulary)
        tl = teach[valid[valid0]] if teach is not None else None   # [N, V]
        if soft is not None and tl is not None:
            rows, acc = soft_loss(logits, tl, soft.mode, soft.temps, soft.ce_weight, soft.fused)
            loss = rows.mean()
        else:
            loss = masked_ce(logits, d.vocab_index(labels[valid]))
            acc = expected_acceptance(logits, tl, METRIC_TEMPERATURE) if tl is not None else None
        pred = torch.zeros_like(labels)
        pred[valid] = d.vocab_token(logits.argmax(-1))
        accept = torch.zeros(labels.shape)
        if acc is not None:
            accept[valid] = acc.detach().float()
        w = decay ** s
        if bool(valid.any()):
            total = total + w * loss
        wsum += w
        # align by chain start c: step s of chain c sits at position c + s
        corrects.append(F.pad(pred == labels, (0, s))[:, s:])
        valids.append(F.pad(valid, (0, s))[:, s:])
        preds.append(F.pad(pred, (0, s))[:, s:])
        accepts.append(F.pad(accept, (0, s))[:, s:])
        h_in = F.pad(out[:, :-1], (0, 0, 1, 0))
        if on_policy:
            t_in = F.pad(pred[:, :-1].detach(), (1, 0))
    correct = torch.stack(corrects, -1).reshape(B * P, steps)
    valid = torch.stack(valids, -1).reshape(B * P, steps)
    pred = torch.stack(preds, -1).reshape(B * P, steps)
    keep = valid[:, 0]
    accept = torch.stack(accepts, -1).reshape(B * P, steps)[keep] if teach is not None else None
    return StepOut(total / wsum, correct[keep], valid[keep], pred[keep], accept)


class ChainObjective(Objective):
    layers_field = "mtp_layers"

    def drafter_config(self, p: DrafterPreset, mask_id: int, layers: list[int]) -> dict[str, object]:
        return {"num_layers": p.mtp_layers, "num_draft": p.ttt_steps}

    def train_loss(self, d: Drafter, b: Batch, p: DrafterPreset, gen: torch.Generator) -> StepOut:
        return chain_loss(cast(ChainDrafter, d), b, p.ttt_steps, p.ttt_decay,
                          soft=Soft.of(p.loss, p.distill_temps, p.ce_weight, p.fuse_loss))

    def eval_settings(self, p: DrafterPreset) -> dict[str, int]:
        return {f"k{p.ttt_steps}": p.ttt_steps}

    def eval_outs(self, d: Drafter, b: Batch, setting: int, p: DrafterPreset) -> list[StepOut]:
        return [chain_loss(cast(ChainDrafter, d), b, setting, p.ttt_decay)]

    def describe(self, p: DrafterPreset) -> str:
        return f"TTT, on-policy after step 0, step weights {p.ttt_decay:g}^s; {describe_soft(p)}"
