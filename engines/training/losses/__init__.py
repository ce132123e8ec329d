"""Training losses, one file per drafter family; a drafter names its family in `Drafter.objective`."""

from __future__ import annotations

from engines.drafters.base import Drafter
from engines.training.losses.base import Objective, StepOut
from engines.training.losses.block import BlockObjective
from engines.training.losses.chain import ChainObjective
from engines.training.losses.eagle import EagleObjective
from engines.training.losses.spark import SparkObjective
from specroute.errors import UserError

OBJECTIVES: dict[str, Objective] = {
    "chain": ChainObjective(),
    "block": BlockObjective(),
    "spark": SparkObjective(),
    "eagle": EagleObjective(),
}

__all__ = ["OBJECTIVES", "Objective", "StepOut", "objective_for"]


def objective_for(drafter: type[Drafter]) -> Objective:
    if drafter.objective not in OBJECTIVES:
        raise UserError(f"{drafter.kind}: no training objective {drafter.objective!r} "
                        f"(have {', '.join(OBJECTIVES)})")
    return OBJECTIVES[drafter.objective]
