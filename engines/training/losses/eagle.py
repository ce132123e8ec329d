"""EAGLE-3 (`objective = "eagle"`): the chain family's training-time test (`losses/chain.py`: step 0
teacher-forced on the fused target features, later steps on the head's own outputs and argmax
tokens), unrolled deeper than MTP's (`EAGLE_TTT_STEPS`) because the head drafts trees several levels
deep; the depth the drafter serves at stays its own default (`Eagle3Drafter.config_overrides`)."""

from __future__ import annotations

from typing import cast

import torch

from engines.drafters.base import Drafter
from engines.training.batch import Batch
from engines.training.losses.base import StepOut
from engines.training.losses.chain import ChainDrafter, ChainObjective, chain_loss
from engines.training.recipe import DrafterPreset

EAGLE_TTT_STEPS = 5


def ttt_steps(p: DrafterPreset) -> int:
    return max(p.ttt_steps, min(EAGLE_TTT_STEPS, p.max_new - 2))


class EagleObjective(ChainObjective):
    def drafter_config(self, p: DrafterPreset, mask_id: int, layers: list[int]) -> dict[str, object]:
        return {"num_layers": p.mtp_layers, "target_layer_ids": layers}

    def train_loss(self, d: Drafter, b: Batch, p: DrafterPreset, gen: torch.Generator) -> StepOut:
        return chain_loss(cast(ChainDrafter, d), b, ttt_steps(p), p.ttt_decay)

    def eval_settings(self, p: DrafterPreset) -> dict[str, int]:
        return {f"k{ttt_steps(p)}": ttt_steps(p)}

    def describe(self, p: DrafterPreset) -> str:
        return f"TTT over {ttt_steps(p)} steps, on-policy after step 0, step weights {p.ttt_decay:g}^s"
