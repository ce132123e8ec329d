"""Soft-target objectives shared by every loss family: the drafter's distribution q against the
target's p, both at a sampling temperature T.

Speculative sampling accepts a draft x ~ q with probability min(1, p(x)/q(x)), so one position's
expected acceptance is sum_x min(p(x), q(x)) = 1 - TV(p, q). A drafter that matches p is accepted
almost always whatever the entropy; one trained by cross-entropy on the target's greedy tokens puts
its mass on p's argmax and is accepted with probability about p(argmax) at T=1.

- `kl`: KL(p_T || q_T) = sum p_T (log p_T - log q_T); smooth, mass-covering, strong gradients far
  from p. Gradient w.r.t. the drafter's logits z: (q_T - p_T) / T.
- `tv`: TV(p_T, q_T) = 1/2 sum |p_T - q_T| = 1 - expected acceptance, exactly what sampling
  measures; its gradient, 1/2 q_T (s - <q_T, s>) / T with s = sign(q_T - p_T), vanishes where q
  misses p's mass, so alone it learns slowly from a cold start.
- `lk` (AngelSpec's "LK"): lam * KL + (1 - lam) * TV per position, lam = exp(-ETA * sg(1 - TV)):
  KL while acceptance is low, mostly TV once it is high.

Teacher: p_T = softmax(lm_head(h) / T) from the target's final hidden state h, which the
self-distillation cache already stores (bf16) for every position. So the teacher is the target's
full distribution over the whole vocabulary at any temperature, computed in fp32 at training time;
no top-k truncation (and no approximation of KL) beyond the bf16 rounding of h. At inference a draft
vocabulary restricts q to N frequent tokens (q = 0 elsewhere): the loss is taken over the full
vocabulary, and the mass the target puts outside the set is what that restriction can never accept.

The objective averages the loss over the training temperatures and adds `ce_weight` x CE against
the target's argmax (what temperature 0 accepts). `SoftTarget` computes loss and gradient in one
pass, keeping two [N, V] tensors for backward instead of autograd's six or so per temperature. With
`fused` (the recipe's `fuse_loss`), the same terms are written in plain autograd ops and compiled by
`torch.compile`, which fuses the ~20 elementwise passes over [N, V] into a few (2.5x faster on a CPU,
where this loss is most of a step); where compiling fails (no C++ compiler), the eager path runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

ETA = 3.0
SOFT_LOSSES = ("kl", "tv", "lk")
METRIC_TEMPERATURE = 1.0   # expected acceptance of sampled drafts is reported at T=1


@dataclass(frozen=True)
class Soft:
    """The soft-target part of a recipe (`DrafterPreset.loss` other than "ce")."""

    mode: str
    temps: tuple[float, ...]
    ce_weight: float
    fused: bool = False

    @classmethod
    def of(cls, loss: str, temps: Sequence[float], ce_weight: float, fused: bool = False) -> Soft | None:
        return None if loss == "ce" else cls(loss, tuple(temps), ce_weight, fused)


class SoftTarget(torch.autograd.Function):
    """(z [N, V] drafter logits, logp [N, V] teacher log-probs at T (no gradient), T, mode)
    -> (loss [N], tv [N]); the tv output carries no gradient (a metric)."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, logp: Tensor, temperature: float, mode: str) -> tuple[Tensor, Tensor]:
        dt = torch.promote_types(z.dtype, torch.float32)              # fp32 (fp64 in gradcheck)
        logp = logp.to(dt)
        logq = F.log_softmax(z.to(dt) / temperature, dim=-1)          # [N, V]
        p = logp.exp()
        q = logq.exp()
        kl = (p * (logp - logq)).sum(-1)                              # [N]
        d = q - p                                                     # [N, V]
        tv = 0.5 * d.abs().sum(-1)                                    # [N]
        if mode == "kl":
            lam = torch.ones_like(tv)
        elif mode == "tv":
            lam = torch.zeros_like(tv)
        else:
            lam = torch.exp(-ETA * (1.0 - tv))
        ctx.save_for_backward(q, d, lam)
        ctx.temperature = temperature
        ctx.z_dtype = z.dtype
        ctx.mark_non_differentiable(tv)
        return lam * kl + (1.0 - lam) * tv, tv

    @staticmethod
    def backward(ctx: Any, g: Tensor, _g_tv: Tensor) -> tuple[Tensor | None, None, None, None]:
        q, d, lam = ctx.saved_tensors
        # sign(q - p), with the subgradient 0 where q and p agree up to rounding (TV's minimum)
        s = torch.sign(d) * (d.abs() > 8 * torch.finfo(d.dtype).eps)
        grad_tv = 0.5 * q * (s - (q * s).sum(-1, keepdim=True))
        grad = lam[:, None] * d + (1.0 - lam[:, None]) * grad_tv      # x 1/T below
        return (g[:, None] * grad / ctx.temperature).to(ctx.z_dtype), None, None, None


def soft_terms(z: Tensor, teacher_logits: Tensor, temperature: float, mode: str) -> tuple[Tensor, Tensor]:
    """`SoftTarget`'s (loss [N], tv [N]) in plain autograd ops, from the teacher's logits (the form
    `torch.compile` fuses). TV's subgradient where q = p exactly is 0, as `SoftTarget`'s."""
    dt = torch.promote_types(z.dtype, torch.float32)
    logp = F.log_softmax(teacher_logits.to(dt) / temperature, dim=-1)
    logq = F.log_softmax(z.to(dt) / temperature, dim=-1)
    p, q = logp.exp(), logq.exp()
    kl = (p * (logp - logq)).sum(-1)
    tv = 0.5 * (q - p).abs().sum(-1)
    if mode == "kl":
        lam = torch.ones_like(tv)
    elif mode == "tv":
        lam = torch.zeros_like(tv)
    else:
        lam = torch.exp(-ETA * (1.0 - tv.detach()))
    return lam * kl + (1.0 - lam) * tv, tv.detach()


_fused: Any = None   # torch.compile(soft_terms), made on first use; False once compiling failed


def _fused_terms(z: Tensor, teacher_logits: Tensor, temperature: float, mode: str) -> tuple[Tensor, Tensor] | None:
    """`soft_terms` compiled, or None where this machine cannot compile (then the eager path runs)."""
    global _fused
    if _fused is False:
        return None
    if _fused is None:
        _fused = torch.compile(soft_terms, dynamic=True)
    try:
        return _fused(z, teacher_logits, temperature, mode)
    except Exception as exc:  # no C++ toolchain, an unsupported op: train eagerly, say so once
        log.warning("fused soft loss unavailable (%s: %s); computing it eagerly", type(exc).__name__, exc)
        _fused = False
        return None


def soft_loss(logits: Tensor, teacher_logits: Tensor, mode: str, temps: Sequence[float],
              ce_weight: float = 0.0, fused: bool = False) -> tuple[Tensor, Tensor]:
    """logits [N, V] (drafter, with gradient), teacher_logits [N, V] (target, fp32, no gradient)
    -> (per-position loss [N]: mean over `temps` of the `mode` term + ce_weight x CE on the target's
    argmax; expected acceptance of sampled drafts 1 - TV at the last temperature [N], no gradient).
    `fused`: the terms by `torch.compile` (same values up to rounding, fewer passes)."""
    if mode not in SOFT_LOSSES:
        raise ValueError(f"unknown soft loss {mode!r} (have {', '.join(SOFT_LOSSES)})")
    dt = torch.promote_types(logits.dtype, torch.float32)
    total = logits.new_zeros(logits.shape[0], dtype=dt)
    tv = total
    for t in temps:
        got = _fused_terms(logits, teacher_logits, float(t), mode) if fused else None
        if got is None:
            logp = F.log_softmax(teacher_logits.to(dt) / t, dim=-1)
            got = SoftTarget.apply(logits, logp, float(t), mode)
        loss_t, tv = got
        total = total + loss_t / len(temps)
    if ce_weight:
        total = total + ce_weight * F.cross_entropy(logits.to(dt), teacher_logits.argmax(-1), reduction="none")
    return total, 1.0 - tv


@torch.no_grad()
def teacher_logits(target_logits_fn: Any, hidden: Tensor) -> Tensor:
    """The target's exact logits [N, V] fp32 from its final hidden states [N, H] (autocast off)."""
    with torch.autocast("cpu", enabled=False):
        return target_logits_fn(hidden.float()).float()


@torch.no_grad()
def expected_acceptance(logits: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """1 - TV(p_T, q_T) per row [N]: the acceptance rate of drafts sampled from q_T."""
    q = torch.softmax(logits.float() / temperature, -1)
    p = torch.softmax(teacher.float() / temperature, -1)
    return 1.0 - 0.5 * (p - q).abs().sum(-1)
