"""DSpark (`objective = "spark"`): the block loss (`losses/block.py`) plus the confidence head's BCE.

The confidence head predicts whether a slot's draft is accepted given that the slots before it were;
its label is whether the slot's argmax equals the target's own token (the self-distilled text is the
target's greedy output, so that is exactly acceptance at temperature 0), on valid slots only. The head
reads detached inputs (`DSparkDrafter.draft_logits`), so this term trains only the head.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.drafters.base import Drafter
from engines.training.batch import Batch
from engines.training.losses.base import StepOut
from engines.training.losses.block import BlockDrafter, BlockObjective, block_loss, sample_anchors
from engines.training.recipe import DrafterPreset

CONF_WEIGHT = 0.1


class SparkObjective(BlockObjective):
    def train_loss(self, d: Drafter, b: Batch, p: DrafterPreset, gen: torch.Generator) -> StepOut:
        sizes = torch.tensor([s for s, _ in p.block_mix])
        probs = torch.tensor([w for _, w in p.block_mix])
        blk = int(sizes[torch.multinomial(probs, 1, generator=gen)])
        anchors, keep = sample_anchors(b, p.anchors, gen)
        out = block_loss(cast(BlockDrafter, d), b, anchors, keep, blk)
        conf: Tensor | None = getattr(d, "conf_logits", None)     # [B, A, Bk-1]
        if conf is None or not bool(out.valid.any()):
            return out
        conf = conf.reshape(-1, blk - 1)[keep.view(-1)]            # aligned with out.correct / out.valid
        bce = F.binary_cross_entropy_with_logits(conf[out.valid].float(), out.correct[out.valid].float())
        return StepOut(out.loss + CONF_WEIGHT * bce, out.correct, out.valid, out.pred)

    def describe(self, p: DrafterPreset) -> str:
        return f"{super().describe(p)}; confidence head: BCE vs target-argmax match (x{CONF_WEIGHT:g})"
