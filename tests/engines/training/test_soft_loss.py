"""The soft-target objectives (engines/training/losses/soft.py): exact gradients, zero at q = p, and
descent that moves q towards p; and the chain / block families training on them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engines.training.losses import soft as soft_module
from engines.training.losses.block import block_loss
from engines.training.losses.chain import chain_loss
from engines.training.losses.soft import (
    SOFT_LOSSES,
    Soft,
    SoftTarget,
    expected_acceptance,
    soft_loss,
    soft_terms,
)
from tests.engines.training.test_train_drafters import TINY, make_drafter, make_target


def _toy(n: int = 6, v: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g, dtype=torch.float64) * 2, torch.randn(n, v, generator=g, dtype=torch.float64) * 2


@pytest.mark.parametrize("mode", SOFT_LOSSES)
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_gradient_matches_finite_differences(mode, temperature):
    z, t = _toy()
    logp = F.log_softmax(t / temperature, -1)
    z.requires_grad_(True)
    # lk's mixing weight is a stop-gradient: gradcheck its function with the weight frozen, i.e. check
    # kl and tv exactly and lk against the frozen-weight mix of their gradients
    if mode == "lk":
        loss, tv = SoftTarget.apply(z, logp, temperature, "lk")
        lam = torch.exp(-3.0 * (1 - tv)).detach()
        (g,) = torch.autograd.grad(loss.sum(), z)
        kl_l, _ = SoftTarget.apply(z, logp, temperature, "kl")
        tv_l, _ = SoftTarget.apply(z, logp, temperature, "tv")
        (gk,) = torch.autograd.grad((lam * kl_l).sum(), z)
        (gt,) = torch.autograd.grad(((1 - lam) * tv_l).sum(), z)
        torch.testing.assert_close(g, gk + gt)
    else:
        assert torch.autograd.gradcheck(lambda x: SoftTarget.apply(x, logp, temperature, mode)[0], (z,))


def test_values_match_the_definitions():
    z, t = _toy()
    for temperature in (0.7, 1.0):
        p, q = torch.softmax(t / temperature, -1), torch.softmax(z / temperature, -1)
        kl, tv = SoftTarget.apply(z, torch.log(p), temperature, "kl")
        torch.testing.assert_close(kl, (p * (p.log() - q.log())).sum(-1))
        torch.testing.assert_close(tv, 0.5 * (p - q).abs().sum(-1))
        torch.testing.assert_close(1 - tv, torch.minimum(p, q).sum(-1))   # acceptance of sampled drafts
        torch.testing.assert_close(expected_acceptance(z, t, temperature).double(), 1 - tv, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", SOFT_LOSSES)
def test_zero_loss_and_zero_gradient_when_q_equals_p(mode):
    _, t = _toy()
    z = (t + 3.0).clone().requires_grad_(True)   # same distribution (logits up to a constant)
    loss, acc = soft_loss(z, t, mode, (0.7, 1.0))
    loss.sum().backward()
    assert float(loss.detach().abs().max()) < 1e-9
    torch.testing.assert_close(acc, torch.ones_like(acc))
    assert z.grad is not None and float(z.grad.abs().max()) < 1e-9


@pytest.mark.parametrize("mode", SOFT_LOSSES)
def test_descent_moves_q_towards_p(mode):
    z, t = _toy(seed=1)
    z = z.float().requires_grad_(True)
    t = t.float()
    opt = torch.optim.Adam([z], lr=0.05)
    first = float(soft_loss(z, t, mode, (1.0,))[1].mean())
    for _ in range(300):
        loss, _ = soft_loss(z, t, mode, (0.7, 1.0), ce_weight=0.0)
        opt.zero_grad()
        loss.mean().backward()
        opt.step()
    last = float(soft_loss(z, t, mode, (1.0,))[1].mean())
    assert last > 0.97 and last > first, (first, last)   # acceptance of sampled drafts at T=1


def test_ce_weight_adds_cross_entropy_on_the_target_argmax():
    z, t = _toy()
    base, _ = soft_loss(z, t, "kl", (1.0,))
    with_ce, _ = soft_loss(z, t, "kl", (1.0,), ce_weight=0.5)
    torch.testing.assert_close(with_ce - base, 0.5 * F.cross_entropy(z, t.argmax(-1), reduction="none"))


def _batch_with_teacher(target, d, tokens, prompt_len):
    from engines.training.batch import Batch

    S = tokens.shape[0]
    with torch.no_grad():
        out = target(tokens[None], torch.arange(S)[None], capture=d.capture_layers)
    return Batch(tokens[None], d.features(out), torch.tensor([S]), torch.tensor([prompt_len]), out.hidden)


@pytest.mark.parametrize("kind", ["mtp", "dflash", "dfly"])
def test_families_train_on_the_soft_objective(kind):
    """With KL to the target as the only loss, a drafter's expected acceptance of sampled drafts at
    T=1 (reported by the loss itself) rises on the text it trains on."""
    torch.manual_seed(0)
    target = make_target()
    d = make_drafter(kind, target, std=0.02).train()
    tokens = torch.randint(3, TINY.vocab_size, (40,), generator=torch.Generator().manual_seed(5))
    b = _batch_with_teacher(target, d, tokens, 4)
    soft = Soft("kl", (0.7, 1.0), 0.0)
    anchors = torch.arange(4, 36, 4)[None]
    keep = torch.ones_like(anchors, dtype=torch.bool)

    def run():
        if kind == "mtp":
            return chain_loss(d, b, 3, 0.8, soft=soft)
        return block_loss(d, b, anchors, keep, 5, soft=soft)

    opt = torch.optim.AdamW(d.parameters(), lr=3e-3)
    first = run()
    assert first.accept is not None and first.accept.shape == first.correct.shape
    for _ in range(60):
        out = run()
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    last = run()
    assert last.accept is not None
    a0 = float(first.accept[first.valid].mean())
    a1 = float(last.accept[last.valid].mean())
    assert last.loss.item() < 0.7 * first.loss.item() and a1 > a0 + 0.05, (first.loss.item(), last.loss.item(), a0, a1)


def test_soft_objective_without_teacher_is_an_error():
    target = make_target()
    d = make_drafter("mtp", target)
    b = _batch_with_teacher(target, d, torch.arange(3, 20), 4)
    b.teacher = None
    with pytest.raises(ValueError, match="teacher"):
        chain_loss(d, b, 2, 0.8, soft=Soft("kl", (1.0,), 0.0))


@pytest.mark.parametrize("mode", SOFT_LOSSES)
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_fusable_terms_equal_the_soft_target(mode, temperature):
    """`soft_terms` (what `torch.compile` fuses) gives `SoftTarget`'s loss, TV and gradient."""
    z, t = _toy(seed=3)
    z.requires_grad_(True)
    loss, tv = soft_terms(z, t, temperature, mode)
    (g,) = torch.autograd.grad(loss.sum(), z)
    ref, ref_tv = SoftTarget.apply(z, F.log_softmax(t / temperature, -1), temperature, mode)
    (g_ref,) = torch.autograd.grad(ref.sum(), z)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(tv, ref_tv)
    torch.testing.assert_close(g, g_ref)


def test_a_machine_that_cannot_compile_trains_eagerly(monkeypatch):
    """`fused` where compiling fails: the eager loss, and no second try."""
    calls = []

    def broken(fn, **kw):
        def run(*args):
            calls.append(1)
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(soft_module, "_fused", None)
    monkeypatch.setattr(soft_module.torch, "compile", broken)
    z, t = _toy(seed=4)
    for _ in range(2):
        got = soft_loss(z, t, "lk", (0.7, 1.0), 0.2, fused=True)
        want = soft_loss(z, t, "lk", (0.7, 1.0), 0.2)
        torch.testing.assert_close(got, want)
    assert calls == [1] and soft_module._fused is False
