"""The drafter training recipe (`DrafterPreset`) and its named presets (`--preset demo|tiny`).

One recipe serves every drafter kind: each loss family (`engines.training.losses`) reads its own
fields (chain: `mtp_layers`, `ttt_*`; block: `block_layers`, `block_size`, `anchors`, `block_mix`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engines.training.optim import Schedule
from specroute.errors import UserError


@dataclass(frozen=True)
class DrafterPreset(Schedule):
    # data: the target's own greedy responses (self-distillation), generated once for all drafters
    per_domain: int = 700           # train prompts per domain
    heldout_per_domain: int = 40    # held-out prompts per domain (reporting only)
    max_prompt: int = 320
    max_new: int = 192
    gen_batch: int = 64
    # wall-time budget per drafter: after `calibrate_at` steps the total is fixed to what fits (<= steps)
    time_budget_s: float | None = 600.0
    calibrate_at: int = 20
    # chain drafters (MTP): depth, unrolled training-time-test steps, step weights ttt_decay**s
    mtp_layers: int = 1
    ttt_steps: int = 3
    ttt_decay: float = 0.8
    # block drafters: depth, captured target layers, block, anchors per row, (block size, probability)
    block_layers: int = 2
    n_target_layers: int = 3
    block_size: int = 16
    anchors: int = 32
    block_mix: tuple[tuple[int, float], ...] = ((16, 0.75), (8, 0.25))
    draft_vocab: int = 2048          # drafting head rows: the target's most frequent output tokens (0 = all)


DEMO = DrafterPreset(steps=2000, batch_size=8, lr=2e-3, min_lr=2e-4, warmup=40, weight_decay=0.01,
                     eval_every=100_000, ckpt_every=50)   # evaluation: besides half-way and at the end
PRESETS = {
    "demo": DEMO,
    "tiny": replace(DEMO, per_domain=3, heldout_per_domain=1, max_prompt=96, max_new=10, gen_batch=4, steps=6,
                    batch_size=2, warmup=2, anchors=4, block_size=4, block_mix=((4, 0.5), (3, 0.5)),
                    eval_every=3, ckpt_every=2, threads=1, time_budget_s=None),
}


def resolve_preset(name: str, budget_s: float | None = None, max_steps: int | None = None) -> DrafterPreset:
    """A named preset; `budget_s` / `max_steps` override its wall-time budget and step cap."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r} (have {', '.join(PRESETS)})")
    p = PRESETS[name]
    if budget_s is not None:
        p = replace(p, time_budget_s=budget_s)
    if max_steps is not None:
        p = replace(p, steps=max_steps)
    return p
