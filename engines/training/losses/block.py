"""Block drafters (DFlash, DFly; `objective = "block"`): random anchors in the response; the block
`[x_a, MASK...]` at positions a..a+B-1 sees context < a and its own block (dense boolean mask + SDPA);
slot k predicts x_{a+k}; CE weighted by exp(-(k-1)/gamma), gamma = B/2; block sizes drawn from
`block_mix` (16 mixed with 8) so one set of weights serves both. With a soft objective
(`losses.soft`) the per-slot CE becomes the distance to the target's distribution for x_{a+k} (its
final hidden at a+k-1) at the training temperatures, with the same slot weights; with a teacher in the
batch, the expected acceptance of sampled drafts (1 - TV at T=1) is reported per slot.

A block drafter provides `context_kv(feats, positions)` (per layer roped context K/V),
`backbone(block, positions, ctx_kv, mask)` (one pass over the blocks -> final hidden) and
`draft_logits(h, block)` (block-slot hidden, teacher-forced block tokens -> logits of slots 1..).
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.drafters.base import Drafter
from engines.drafters.config import DraftConfig
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

EVAL_ANCHORS = 32   # anchors per row and pass when every response position is scored


class BlockDrafter(Protocol):
    cfg: DraftConfig

    def context_kv(self, feats: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]: ...
    def backbone(self, block: Tensor, positions: Tensor, ctx_kv: list[tuple[Tensor, Tensor]],
                 mask: Tensor) -> Tensor: ...
    def draft_logits(self, h: Tensor, block: Tensor) -> Tensor: ...
    def lm_logits(self, hidden: Tensor) -> Tensor: ...
    def vocab_index(self, tokens: Tensor) -> Tensor: ...
    def vocab_token(self, index: Tensor) -> Tensor: ...


def sample_anchors(b: Batch, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Up to n distinct anchors a in [prompt_len, length-2] per row -> anchors, keep [B, n]."""
    B = b.tokens.shape[0]
    anchors = torch.zeros(B, n, dtype=torch.long)
    keep = torch.zeros(B, n, dtype=torch.bool)
    for r in range(B):
        lo, hi = int(b.prompt_lens[r]), int(b.lengths[r]) - 1
        m = max(0, hi - lo)
        take = torch.randperm(m, generator=gen)[:n] + lo if m else torch.zeros(0, dtype=torch.long)
        take = take.sort().values
        anchors[r, :len(take)] = take
        keep[r, :len(take)] = True
    return anchors, keep


def all_anchors(b: Batch, chunk: int) -> list[tuple[Tensor, Tensor]]:
    """Every response position as an anchor (evaluation), in chunks of `chunk` per row."""
    B = b.tokens.shape[0]
    spans = [(int(b.prompt_lens[r]), int(b.lengths[r]) - 1) for r in range(B)]
    longest = max(hi - lo for lo, hi in spans)
    out = []
    for c in range(0, max(longest, 0), chunk):
        anchors = torch.zeros(B, chunk, dtype=torch.long)
        keep = torch.zeros(B, chunk, dtype=torch.bool)
        for r, (lo, hi) in enumerate(spans):
            a = torch.arange(lo + c, max(lo + c, min(hi, lo + c + chunk)))
            anchors[r, :len(a)] = a
            keep[r, :len(a)] = True
        out.append((anchors, keep))
    return out


def block_loss(d: BlockDrafter, b: Batch, anchors: Tensor, keep: Tensor, block: int,
               gamma: float | None = None, soft: Soft | None = None) -> StepOut:
    B, S = b.tokens.shape
    A = anchors.shape[1]
    Q = A * block
    ctx_kv = d.context_kv(b.feats, torch.arange(S).expand(B, S))
    bpos = anchors[:, :, None] + torch.arange(block)                        # [B, A, Bk]
    labels = b.tokens.gather(1, bpos.clamp(max=S - 1).view(B, -1)).view(B, A, block)
    inp = torch.full_like(labels, int(d.cfg.mask_token_id or 0))
    inp[..., 0] = labels[..., 0]
    seen = torch.arange(S)[None, None, :] < anchors[:, :, None]             # [B, A, S]
    seen = seen[:, :, None, :].expand(B, A, block, S).reshape(B, Q, S)
    blk = torch.arange(Q) // block
    own = (blk[:, None] == blk[None, :]).expand(B, Q, Q)
    mask = torch.cat([seen, own], dim=-1)[:, None]                           # [B, 1, Q, S+Q]
    h = d.backbone(inp.view(B, Q), bpos.view(B, Q), ctx_kv, mask).view(B, A, block, -1)
    logits = d.draft_logits(h, labels)                                       # [B, A, Bk-1, V]
    target = labels[..., 1:]
    valid = (bpos[..., 1:] < b.lengths[:, None, None]) & keep[..., None]
    gamma = gamma or block / 2
    w = torch.exp(-torch.arange(block - 1, dtype=torch.float32) / gamma)    # slot k: exp(-(k-1)/gamma)
    wv = w * valid
    accept = None
    if b.teacher is not None:   # slot k's teacher: the target's final hidden at a+k-1
        hpos = bpos[..., :-1].clamp(max=S - 1)                                  # [B, A, Bk-1]
        hid = b.teacher.gather(1, hpos.reshape(B, -1, 1).expand(-1, -1, b.teacher.shape[-1]))
        tl = teacher_logits(d.lm_logits, hid.view(B, A, block - 1, -1)[valid])  # [N, V]
        accept = torch.zeros(valid.shape)
    if soft is not None:
        if b.teacher is None:
            raise ValueError("a soft objective needs the batch's teacher (make_batch(..., teacher=True))")
        rows, acc = soft_loss(logits[valid], tl, soft.mode, soft.temps, soft.ce_weight, soft.fused)   # [N]
        loss = (rows * w.expand_as(valid)[valid]).sum() / wv.sum().clamp(min=1e-6)
    else:
        tgt = d.vocab_index(target)                                          # -100: outside the vocabulary
        ce = F.cross_entropy(logits.permute(0, 3, 1, 2), tgt, reduction="none")  # [B, A, Bk-1]
        wce = wv * (tgt != -100)
        loss = (ce * wce).sum() / wce.sum().clamp(min=1e-6)
        acc = expected_acceptance(logits[valid], tl, METRIC_TEMPERATURE) if accept is not None else None
    if accept is not None and acc is not None:
        accept[valid] = acc.detach().float()
    pred = d.vocab_token(logits.argmax(-1)).reshape(B * A, block - 1)
    correct = pred == target.reshape(B * A, block - 1)
    k = keep.view(-1)
    acc_rows = accept.reshape(B * A, block - 1)[k] if accept is not None else None
    return StepOut(loss, correct[k], valid.reshape(B * A, block - 1)[k], pred[k], acc_rows)


class BlockObjective(Objective):
    layers_field = "block_layers"

    def drafter_config(self, p: DrafterPreset, mask_id: int, layers: list[int]) -> dict[str, object]:
        return {"num_layers": p.block_layers, "block_size": p.block_size, "mask_token_id": mask_id,
                "target_layer_ids": layers}

    def train_loss(self, d: Drafter, b: Batch, p: DrafterPreset, gen: torch.Generator) -> StepOut:
        sizes = torch.tensor([s for s, _ in p.block_mix])
        probs = torch.tensor([w for _, w in p.block_mix])
        blk = int(sizes[torch.multinomial(probs, 1, generator=gen)])
        anchors, keep = sample_anchors(b, p.anchors, gen)
        return block_loss(cast(BlockDrafter, d), b, anchors, keep, blk,
                          soft=Soft.of(p.loss, p.distill_temps, p.ce_weight, p.fuse_loss))

    def eval_settings(self, p: DrafterPreset) -> dict[str, int]:
        return {f"block{n}": n for n in sorted({p.block_size, p.block_size // 2}, reverse=True)}

    def eval_outs(self, d: Drafter, b: Batch, setting: int, p: DrafterPreset) -> list[StepOut]:
        return [block_loss(cast(BlockDrafter, d), b, a, k, setting) for a, k in all_anchors(b, EVAL_ANCHORS)]

    def describe(self, p: DrafterPreset) -> str:
        return f"random anchors, block+context mask, slot weights exp(-(k-1)/(B/2)); {describe_soft(p)}"
