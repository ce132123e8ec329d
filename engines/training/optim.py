"""What the target's and the drafters' training loops share: the optimisation settings, AdamW with
linear warmup then cosine decay (weight decay on matrices only), one clipped optimiser step,
checkpoints written atomically (a crash never leaves a half-written one), and the precision of the
forward passes: bf16 autocast where the CPU multiplies bf16 natively (`engines.precision`), else fp32."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from engines.precision import bf16_is_native


@dataclass(frozen=True, kw_only=True)
class Schedule:
    steps: int               # optimiser steps (drafters: a cap, see their time budget)
    batch_size: int
    lr: float                # peak, after `warmup` linear steps; cosine decay to `min_lr` at the end
    min_lr: float
    warmup: int
    weight_decay: float      # matrices only
    eval_every: int
    ckpt_every: int
    seed: int = 1234
    threads: int = 2


def train_autocast() -> contextlib.AbstractContextManager:
    """The training forward's precision: bf16 autocast where it is native, else fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_is_native())


def precision() -> str:
    """What `train_autocast` does here, for the training reports."""
    return "bf16 autocast" if bf16_is_native() else "fp32 (no native bf16 on this CPU)"


def lr_at(step: int, total: int, s: Schedule) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, total - s.warmup))
    return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1 + math.cos(math.pi * frac))


def adamw(params: Sequence[nn.Parameter], s: Schedule) -> torch.optim.AdamW:
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))


def optimizer_step(opt: torch.optim.Optimizer, params: Sequence[nn.Parameter], loss: Tensor, lr: float) -> None:
    """Backward `loss`, clip the gradient norm to 1 and step at learning rate `lr`."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)
