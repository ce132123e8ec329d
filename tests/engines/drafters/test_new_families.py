"""DFlare, DSpark and EAGLE-3 on tiny targets: what each adds to its anchor (DFlare's own context
projections, DSpark(zero Markov bias) == DFlash, EAGLE-3's top-1 tree == its chain), training forwards
== drafting, losses go down, the tiny pipeline trains each, and sampled output at temperature > 0
follows the target's exact distribution (chi-square over the first two tokens)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engines.drafters.dflash import DFlashDrafter
from engines.drafters.mtp import MTPDrafter
from engines.drafters.registry import load_drafter, new_drafter
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from engines.training.drafters import train_drafter
from engines.training.losses import objective_for
from engines.training.losses.block import all_anchors, block_loss
from engines.training.losses.chain import chain_loss
from engines.training.recipe import PRESETS
from tests.engines.training.test_train_drafters import batch_for, bundle, ctx_upto  # noqa: F401 (fixture)
from tests.engines.training.test_train_drafters import make_drafter as make_trainable

from .test_drafters import MAX_LEN, TINY, assert_same, context, make_drafter, make_target, sequences

NEW = ["dflare", "dspark", "eagle3"]


def chi2_pvalue(observed: list[float], expected: list[float]) -> float:
    """Upper tail of the chi-square statistic (Wilson-Hilferty normal approximation)."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    dof = max(1, sum(1 for e in expected if e > 0) - 1)
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_dflare_has_per_layer_context_projections_and_no_shared_fc():
    target = make_target()
    d = make_drafter("dflare", target)
    names = set(d.state_dict())
    assert not any(n.startswith(("fc.", "hidden_norm.")) for n in names)
    assert {"ctx_k.0.weight", "ctx_v.1.weight", "fusion_weights"} <= names
    feats = torch.randn(2, 5, 3 * TINY.hidden_size)
    kv = d.context_kv(feats, torch.arange(5).expand(2, 5))
    with torch.no_grad():
        d.ctx_k[0].weight.zero_()
    kv0 = d.context_kv(feats, torch.arange(5).expand(2, 5))
    assert not kv0[0][0].any() and torch.equal(kv0[1][0], kv[1][0])   # layer 0's keys are its own


def test_dspark_with_zero_markov_bias_is_dflash():
    target = make_target()
    spark = make_drafter("dspark", target)
    with torch.no_grad():
        spark.markov_out.weight.zero_()
    cfg = spark.cfg.model_copy(update={"kind": "dflash", "markov_rank": 0})
    flash = DFlashDrafter(target, cfg)
    missing, unexpected = flash.load_state_dict(spark.state_dict(), strict=False)
    assert not missing and all(u.startswith(("markov_", "confidence.")) for u in unexpected)
    for d in (spark, flash):
        d.eval().allocate(2, MAX_LEN)
    ctx = context(target, spark, sequences([22, 15]), [0, 0], [19, 12], slots=[0, 1])
    a, b = spark.propose(ctx, 5), flash.propose(ctx, 5)
    assert torch.equal(a.tokens, b.tokens)
    assert bool(((a.conf > 0) & (a.conf < 1)).all())     # the confidence head, not the softmax


def test_eagle3_top1_tree_is_its_chain_and_trees_are_well_formed():
    target = make_target()
    chain = make_drafter("eagle3", target, tree_topk=1, tree_nodes=6)
    chain.allocate(2, MAX_LEN)
    seqs = sequences([21, 13])
    ctx = context(target, chain, seqs, [0, 0], [18, 10], slots=[0, 1])
    tree = chain.propose(ctx, 5)
    ref = MTPDrafter.propose(chain, ctx, 5)               # the plain chain through the positional cache
    assert tree.parents is not None and tree.parents.tolist() == [[-1, 0, 1, 2, 3]] * 2
    assert_same(tree, ref)
    wide = make_drafter("eagle3", target)                  # top-4, depth 6, 24 nodes
    wide.allocate(2, MAX_LEN)
    p = wide.propose(context(target, wide, seqs, [0, 0], [18, 10], slots=[0, 1]), 6)
    assert p.parents is not None and p.tokens.shape == (2, 24)
    idx = torch.arange(24)
    assert bool((p.parents < idx).all()) and bool((p.parents >= -1).all())
    assert int((p.parents == -1).sum(1).min()) >= 1
    for b in range(2):   # siblings are distinct tokens (top-k)
        pairs = list(zip(p.parents[b].tolist(), p.tokens[b].tolist(), strict=True))
        assert len(set(pairs)) == len(pairs)
    assert torch.equal(p.tokens[:, 0], tree.tokens[:, 0])   # the root's best child: the chain's d_1


@pytest.mark.parametrize("kind", ["dflare", "dspark"])
@torch.no_grad()
def test_block_training_forward_matches_drafting(kind):
    from tests.engines.training.test_train_drafters import make_target as train_target

    target = train_target()
    d = make_trainable(kind, target).eval()
    tokens = torch.randint(3, target.config.vocab_size, (20,), generator=torch.Generator().manual_seed(2))
    b = batch_for(target, kind, d, tokens, 5)
    (anchors, keep), = all_anchors(b, 32)
    out = block_loss(d, b, anchors, keep, block=5)
    assert out.pred is not None
    for row, a in enumerate(anchors[0][keep[0]].tolist()):
        d.allocate(1, 64)
        ctx = ctx_upto(target, d, tokens, a)
        prop = d.propose(ctx, 4)
        if kind == "dflare":
            assert torch.equal(prop.tokens[0], out.pred[row]), a
        else:   # teacher-forced predecessors: equal given the drafted ones
            d.allocate(1, 64)
            forced = torch.cat([ctx.last_token, prop.tokens[0]])[None]
            assert torch.equal(d.draft_logits(d.block_hidden(ctx), forced).argmax(-1)[0], prop.tokens[0])


@torch.no_grad()
def test_eagle3_ttt_matches_its_inference_chain():
    from tests.engines.training.test_train_drafters import make_target as train_target

    target = train_target()
    d = make_trainable("eagle3", target).eval()
    tokens = torch.randint(3, target.config.vocab_size, (24,), generator=torch.Generator().manual_seed(2))
    out = chain_loss(d, batch_for(target, "eagle3", d, tokens, 6), steps=4, decay=0.8)
    assert out.pred is not None
    for row, c in enumerate(range(5, 22)):
        d.allocate(1, 64)
        prop = MTPDrafter.propose(d, ctx_upto(target, d, tokens, c + 1), 4)
        v = out.valid[row]
        assert v[0] and torch.equal(prop.tokens[0][v], out.pred[row][v]), c


@pytest.mark.parametrize("kind", NEW)
def test_loss_goes_down(kind):
    from tests.engines.training.test_train_drafters import make_target as train_target

    target = train_target()
    d = make_trainable(kind, target, std=0.02).train()
    b = batch_for(target, kind, d, torch.arange(48) * 7 % 13 + 3, 4)
    p = replace(PRESETS["tiny"], loss="ce")   # the batch carries no teacher: the family's own CE loss
    objective = objective_for(type(d))
    opt = torch.optim.AdamW(d.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(60):
        out = objective.train_loss(d, b, p, gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    if kind == "dspark":   # the confidence head learned to tell accepted slots from the others
        assert d.confidence.weight.abs().sum() > 0


@pytest.mark.parametrize("kind", NEW)
def test_tiny_pipeline_trains_reports_and_loads(bundle, kind):  # noqa: F811
    report = train_drafter(kind, bundle, "tiny", work_dir=bundle.parent / "work", resume=False)
    s = report["summary"]
    assert s["kind"] == kind and s["steps"] == 6 and s["file_mb"] < 64
    assert s["heldout"] and all(v["mean_tau"] >= 1.0 for v in s["heldout"].values())
    from engines.model import load_model

    d = load_drafter(kind, Path(bundle), load_model(bundle))
    assert d.cfg.kind == kind


@pytest.mark.parametrize(("kind", "sample_drafts"), [("dflare", True), ("dspark", True), ("dspark", False),
                                                     ("eagle3", False)])
def test_sampled_first_tokens_follow_the_target_distribution(kind, sample_drafts):
    from tests.engines.test_tree import _exact_pairs

    target = make_target()
    d = new_drafter(kind, target, **({} if kind == "eagle3" else {"block_size": 4})).eval()
    with torch.no_grad():   # drafts that depend on the context (the training init is near-uniform)
        for w in d.parameters():
            if w.dim() >= 2:
                w.normal_(0, 0.15)
    temperature, n, slots = 1.0, 1500, 50
    ids = sequences([6], seed=21)[0]
    cells = _exact_pairs(target, ids, temperature)
    dec = SpecDecoder(target, d, slots, len(ids) + 24, sample_drafts=sample_drafts)
    counts: dict[tuple[int, int], int] = {}
    torch.manual_seed(0)   # the unseeded rows' generators
    for _ in range(0, n, slots):
        firsts = dec.prefill_batch(list(range(slots)), [ids] * slots,
                                   [SamplingParams(temperature)] * slots)   # unseeded: sampled drafts
        rows = dec.verify(list(range(slots)), dec.draft(list(range(slots)), 3), [3] * slots)
        for s, (y, row) in enumerate(zip(firsts, rows, strict=True)):
            counts[(y, row[0])] = counts.get((y, row[0]), 0) + 1
            dec.release(s)
    assert all(key in cells for key in counts)
    big = [key for key, p in cells.items() if p * n >= 5]
    obs = [counts.get(key, 0) for key in big] + [n - sum(counts.get(key, 0) for key in big)]
    exp = [cells[key] * n for key in big] + [n - sum(cells[key] * n for key in big)]
    assert chi2_pvalue(obs, exp) > 1e-3, kind
