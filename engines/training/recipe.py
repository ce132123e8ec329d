"""The drafter training recipe (`DrafterPreset`) and its named presets (`--preset demo|tiny`).

One recipe serves every drafter kind: each loss family (`engines.training.losses`) reads its own
fields (chain: `mtp_layers`, `ttt_*`; block: `block_layers`, `block_size`, `anchors`, `block_mix`),
and all share the objective against the target (`loss`, `distill_temps`, `ce_weight`; see
`engines.training.losses.soft`) and the data mix (`sampled_fraction` of the train prompts also
answered by sampling at `sampled_temperature`, besides every greedy answer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engines.training.optim import Schedule
from specroute.errors import UserError


@dataclass(frozen=True)
class DrafterPreset(Schedule):
    # data: the target's own responses (self-distillation), generated once for all drafters: a greedy
    # answer to every train prompt plus, for `sampled_fraction` of them, one sampled at `sampled_temperature`
    per_domain: int = 700           # train prompts per domain
    sampled_fraction: float = 1.0
    sampled_temperature: float = 0.8
    reference_per_domain: int = 0   # reference answers per domain (train prompts', corpus conversations')
                                    # also taught, teacher-forced (the target's distribution at each position)
    heldout_per_domain: int = 40    # held-out prompts per domain (reporting only)
    max_prompt: int = 320
    max_new: int = 192
    gen_batch: int = 64
    gen_chunk: int = 256             # prompts per cached part: an interrupted generation resumes there
    gen_bf16: bool = True            # train answers under bf16 autocast where the CPU has it natively (else fp32,
                                     # the answers the served target gives; held-out answers are always fp32)
    keep_data: bool = False          # keep the train answers' tokens in the bundle (OUT/selfdistill/*.json.gz)
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
    train_in_draft_vocab: bool = False   # train over the draft vocabulary only (N head rows instead of V)
    # objective against the target (every family): "ce" = cross-entropy on the response tokens (the
    # greedy-only recipe); "kl" = KL(p_T || q_T), "tv" = total variation (1 - TV is the acceptance rate
    # of sampled drafts), "lk" = AngelSpec's adaptive mix of the two; p_T the target's full distribution
    # at each temperature of `distill_temps` (averaged), plus `ce_weight` x CE on the target's argmax
    loss: str = "lk"
    distill_temps: tuple[float, ...] = (0.7, 1.0)
    ce_weight: float = 0.2
    fuse_loss: bool = False          # the soft loss compiled by torch.compile (losses/soft.py: ~2.5x faster on a
                                     # CPU, after a compile of ~10 s; eager where no C++ compiler is found)


DEMO = DrafterPreset(steps=2000, batch_size=8, lr=2e-3, min_lr=2e-4, warmup=40, weight_decay=0.01,
                     eval_every=100_000, ckpt_every=50)   # evaluation: besides half-way and at the end
# a pretrained target (SmolLM2-135M-Instruct: 30 layers, width 576, vocabulary 49,152): train answers generated
# under bf16 autocast where the CPU has it natively (AMX/AVX512-BF16: ~10x the fp32 products), else in fp32,
# and held-out answers always in fp32 (what it serves); fewer prompts and smaller
# cached parts (its answers are longer; parts are prefix-stable, so a later run with more prompts per domain
# generates only the new ones), a step cap instead of a wall-time budget (on a shared machine a
# budget makes the run depend on the load), and a larger draft vocabulary (6x the demo's vocabulary), which
# training already ranges over: the LM head over 49,152 rows would cost most of each step
SMOLLM2 = replace(DEMO, per_domain=96, sampled_fraction=0.5, heldout_per_domain=12, max_prompt=384,
                  max_new=160, gen_batch=48, gen_chunk=96, keep_data=True, time_budget_s=None, steps=3000,
                  eval_every=1000, ckpt_every=50, draft_vocab=8192, train_in_draft_vocab=True, fuse_loss=True)
PRESETS = {
    "demo": DEMO,
    "smollm2": SMOLLM2,
    # the recipe of the drafters first shipped in models/demo: greedy data and CE only
    "demo-ce": replace(DEMO, loss="ce", sampled_fraction=0.0),
    "tiny": replace(DEMO, per_domain=3, reference_per_domain=2, heldout_per_domain=1, max_prompt=96, max_new=10, gen_batch=4, steps=6,
                    batch_size=2, warmup=2, anchors=4, block_size=4, block_mix=((4, 0.5), (3, 0.5)),
                    eval_every=3, ckpt_every=2, threads=1, time_budget_s=None),
}


LOSSES = ("ce", "kl", "tv", "lk")


def resolve_preset(name: str, budget_s: float | None = None, max_steps: int | None = None,
                   **overrides: object) -> DrafterPreset:
    """A named preset; `budget_s` / `max_steps` override its wall-time budget and step cap, `overrides`
    (None values ignored) any other field (`loss`, `sampled_fraction`, `distill_temps`, ...)."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r} (have {', '.join(PRESETS)})")
    p = replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    if p.loss not in LOSSES:
        raise UserError(f"unknown loss {p.loss!r} (have {', '.join(LOSSES)})")
    if not 0.0 <= p.sampled_fraction <= 1.0 or p.sampled_temperature <= 0.0:
        raise UserError("sampled_fraction must be in [0, 1] and sampled_temperature > 0")
    if p.loss != "ce" and (not p.distill_temps or min(p.distill_temps) <= 0.0):
        raise UserError("distill_temps must be temperatures > 0")
    if budget_s is not None:
        p = replace(p, time_budget_s=budget_s)
    if max_steps is not None:
        p = replace(p, steps=max_steps)
    return p


def describe_soft(p: DrafterPreset) -> str:
    """The objective against the target, for the training report and the card."""
    if p.loss == "ce":
        return "CE on the response tokens"
    temps = ", ".join(f"{t:g}" for t in p.distill_temps)
    return (f"{p.loss.upper()} vs the target's full distribution at T in {{{temps}}}"
            + (f" + {p.ce_weight:g} x CE on its argmax" if p.ce_weight else ""))
