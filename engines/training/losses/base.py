"""What a loss family provides to the training loop, evaluation and report (`Objective`), and what
its losses return (`StepOut`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from engines.drafters.base import Drafter
from engines.training.batch import Batch
from engines.training.recipe import DrafterPreset


@dataclass
class StepOut:
    loss: Tensor
    correct: Tensor   # [N, K] bool, per chain/block and draft position
    valid: Tensor     # [N, K] bool
    pred: Tensor | None = None  # [N, K] argmax drafts (same layout)
    accept: Tensor | None = None  # [N, K] expected acceptance of sampled drafts (1 - TV at T=1), with a teacher


class Objective:
    """One loss family, selected by `Drafter.objective`: how its drafters are configured from the
    recipe, the loss of one training batch, and the settings it is evaluated at."""

    layers_field: ClassVar[str]   # the recipe field that sets the drafter's depth

    def drafter_config(self, p: DrafterPreset, mask_id: int, layers: list[int]) -> dict[str, object]:
        """DraftConfig fields from the recipe (`layers`: the target layers the data captured)."""
        raise NotImplementedError

    def train_loss(self, d: Drafter, b: Batch, p: DrafterPreset, gen: torch.Generator) -> StepOut:
        raise NotImplementedError

    def eval_settings(self, p: DrafterPreset) -> dict[str, int]:
        """Report key -> draft length or block size the held-out figures are measured at."""
        raise NotImplementedError

    def eval_outs(self, d: Drafter, b: Batch, setting: int, p: DrafterPreset) -> list[StepOut]:
        """Every scored position of `b` (no sampling) at `setting`."""
        raise NotImplementedError

    def describe(self, p: DrafterPreset) -> str:
        """The objective, for the training report and the model card."""
        raise NotImplementedError
