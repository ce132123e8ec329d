"""Drafters on a tiny random target: shapes, ragged batches, incremental == from-scratch caches,
DFly(zero correction) == DFlash-with-fusion, save/load round trip, mismatch errors."""

from __future__ import annotations

import json

import pytest
import torch

from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.drafters.config import build_target_layer_ids
from engines.drafters.dflash import DFlashDrafter
from engines.drafters.registry import DRAFTERS, load_drafter, new_drafter, save_drafter
from engines.model import ModelConfig, Transformer, init_weights
from specroute.errors import UserError

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                   tie_word_embeddings=True)
KINDS = list(DRAFTERS)
MAX_LEN = 96


def make_target(cfg: ModelConfig = TINY, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    t = Transformer(cfg)
    init_weights(t, std=0.1)
    return t.eval()


@pytest.fixture(scope="module")
def target() -> Transformer:
    return make_target()


def make_drafter(kind: str, target: Transformer, seed: int = 1, **cfg) -> Drafter:
    torch.manual_seed(seed)
    d = new_drafter(kind, target, block_size=6, **cfg)
    # larger random weights than the training init so that drafts depend on the context
    with torch.no_grad():
        for name, p in d.named_parameters():
            if p.dim() >= 2 and "correction" not in name:
                p.normal_(0, 0.15)
    return d.eval()


def sequences(lengths: list[int], seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY.vocab_size, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def context(target: Transformer, drafter: Drafter, seqs: list[list[int]], lo: list[int], hi: list[int],
            slots: list[int]) -> DraftContext:
    """Rows commit positions lo[b]..hi[b]-1 of seqs[b]; y0 = seqs[b][hi[b]]."""
    T = max(h - lo_ for lo_, h in zip(lo, hi, strict=True))
    feats, pos, valid, nxt = [], [], [], []
    for s, a, b in zip(seqs, lo, hi, strict=True):
        toks = torch.tensor([s[:b]])
        out = target(toks, torch.arange(b)[None], capture=drafter.capture_layers)
        f = drafter.features(out)[0, a:b]
        n = b - a
        pad = T - n
        feats.append(torch.cat([f, torch.zeros(pad, f.shape[-1])]))
        pos.append(torch.arange(a, a + T))
        valid.append(torch.arange(T) < n)
        nxt.append(torch.tensor(s[a + 1:b + 1] + [0] * pad))
    return DraftContext(
        slots=torch.tensor(slots), feats=torch.stack(feats), positions=torch.stack(pos),
        valid=torch.stack(valid), next_tokens=torch.stack(nxt),
        last_token=torch.tensor([s[h] for s, h in zip(seqs, hi, strict=True)]), start=torch.tensor(hi),
    )


def assert_same(a: Proposal, b: Proposal) -> None:
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.conf, b.conf, atol=1e-5, rtol=1e-4)


def test_layer_ids_rule():
    assert build_target_layer_ids(12, 3) == [1, 5, 9]
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(12, 1) == [6]


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_and_ragged_batch_equals_single_rows(target, kind):
    d = make_drafter(kind, target)
    d.allocate(4, MAX_LEN)
    seqs = sequences([20, 9, 14])
    k = d.max_draft
    ctx = context(target, d, seqs, [0, 0, 0], [17, 6, 13], slots=[2, 0, 3])
    p = d.propose(ctx, k)
    width = k if p.parents is None else d.cfg.tree_nodes   # a tree proposal: its nodes
    assert p.tokens.shape == (3, width) and p.conf.shape == (3, width) and p.probs is None
    assert bool(((p.conf > 0) & (p.conf <= 1)).all())
    for i, (s, n) in enumerate(zip(seqs, [17, 6, 13], strict=True)):
        single = make_drafter(kind, target)
        single.allocate(1, MAX_LEN)
        q = single.propose(context(target, single, [s], [0], [n], slots=[0]), k)
        assert torch.equal(q.tokens[0], p.tokens[i])
        torch.testing.assert_close(q.conf[0], p.conf[i], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_incremental_ingest_equals_from_scratch(target, kind):
    seqs = sequences([40, 33])
    k = 3
    inc = make_drafter(kind, target)
    inc.allocate(2, MAX_LEN)
    # prefill, then two speculative steps committing a few tokens each (drafts are discarded)
    cuts = [[0, 10, 13, 20], [0, 5, 6, 9]]
    for step in range(3):
        lo = [c[step] for c in cuts]
        hi = [c[step + 1] for c in cuts]
        got = inc.propose(context(target, inc, seqs, lo, hi, slots=[0, 1]), k)
    full = make_drafter(kind, target)
    full.allocate(2, MAX_LEN)
    want = full.propose(context(target, full, seqs, [0, 0], [20, 9], slots=[0, 1]), k)
    assert_same(got, want)


def test_dfly_with_zero_correction_is_dflash_with_fusion(target):
    dfly = make_drafter("dfly", target)
    assert not dfly.correction.down_proj.weight.detach().any()
    cfg = dfly.cfg.model_copy(update={"kind": "dflash", "correction_intermediate_size": 0})
    dflash = DFlashDrafter(target, cfg)
    missing, unexpected = dflash.load_state_dict(dfly.state_dict(), strict=False)
    assert not missing and all(u.startswith("correction.") for u in unexpected)
    seqs = sequences([25, 18])
    for d in (dfly, dflash):
        d.eval().allocate(2, MAX_LEN)
    ctx_a = context(target, dfly, seqs, [0, 0], [21, 11], slots=[0, 1])
    a, b = dfly.propose(ctx_a, 5), dflash.propose(ctx_a, 5)
    assert_same(a, b)
    # and training-mode logits agree as well
    block = torch.randint(0, TINY.vocab_size, (2, 6))
    h = torch.randn(2, 6, TINY.hidden_size)
    torch.testing.assert_close(dfly.draft_logits(h, block), dflash.draft_logits(h, block))


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_drafts_return_distributions(target, kind):
    d = make_drafter(kind, target)
    d.sample_drafts = True
    d.allocate(2, MAX_LEN)
    ctx = context(target, d, sequences([12, 8]), [0, 0], [10, 7], slots=[0, 1])
    p = d.propose(ctx, 3, temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(0))
    if p.parents is not None:   # tree drafts are deterministic (top-k): q one-hot, lossless by the tree rule
        assert p.probs is None
        return
    assert p.probs is not None and p.probs.shape == (2, 3, TINY.vocab_size)
    torch.testing.assert_close(p.probs.sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(p.probs.max(-1).values, p.conf)   # D-Cut's score: known before the draft


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(target, kind, tmp_path):
    d = make_drafter(kind, target)
    save_drafter(d, tmp_path / "drafters" / kind)
    cfg = json.loads((tmp_path / "drafters" / kind / "config.json").read_text())
    assert cfg["kind"] == kind and cfg["hidden_size"] == TINY.hidden_size
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "drafters" / kind / "model.safetensors"))
    assert not any(k.startswith(("target", "embed", "lm_head")) for k in saved)
    assert all(v.dtype == torch.bfloat16 for v in saved.values())
    loaded = load_drafter(kind, tmp_path, target, head_dtype=None)
    with torch.no_grad():  # compare against the bf16-rounded original
        for p in d.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    for x in (d, loaded):
        x.allocate(1, MAX_LEN)
    seq = sequences([16])
    assert_same(loaded.propose(context(target, loaded, seq, [0], [12], [0]), 3),
                d.propose(context(target, d, seq, [0], [12], [0]), 3))
    if not DRAFTERS[kind].autoregressive:
        assert load_drafter(kind, tmp_path, target, block_size=4).max_draft == 3


def test_mismatches_are_one_line_user_errors(target, tmp_path):
    save_drafter(make_drafter("dfly", target), tmp_path / "drafters" / "dfly")
    others = {
        "hidden size": ModelConfig(**{**TINY.__dict__, "hidden_size": 32, "intermediate_size": 80, "extra": {}}),
        "vocabulary": ModelConfig(**{**TINY.__dict__, "vocab_size": 101, "extra": {}}),
        "6-layer target": ModelConfig(**{**TINY.__dict__, "num_hidden_layers": 4, "extra": {}}),
    }
    for needle, cfg in others.items():
        with pytest.raises(UserError, match=needle) as exc:
            load_drafter("dfly", tmp_path, make_target(cfg))
        assert "\n" not in str(exc.value)
    with pytest.raises(UserError, match="different target"):
        load_drafter("dfly", tmp_path, make_target(seed=5))
    with pytest.raises(UserError, match="no mtp drafter"):
        load_drafter("mtp", tmp_path, target)
    with pytest.raises(UserError, match="unknown drafter"):
        load_drafter("eagle", tmp_path, target)
    path = tmp_path / "drafters" / "dfly" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({**cfg, "target_layer_ids": [1, 9]}))
    with pytest.raises(UserError, match="layer ids"):
        load_drafter("dfly", tmp_path, target)
    path.write_text(json.dumps({**cfg, "hidden_size": "wide"}))
    with pytest.raises(UserError, match="invalid drafter config"):
        load_drafter("dfly", tmp_path, target)
    path.write_text(json.dumps({**cfg, "kind": "dflash"}))
    with pytest.raises(UserError, match="expected 'dfly'"):
        load_drafter("dfly", tmp_path, target)


@pytest.mark.parametrize("kind", KINDS)
def test_redraft_without_new_context_repeats_the_proposal(target, kind):
    d = make_drafter(kind, target)
    d.allocate(2, MAX_LEN)
    seqs = sequences([20, 12])
    first = d.propose(context(target, d, seqs, [0, 0], [15, 9], slots=[0, 1]), 3)
    ctx = context(target, d, seqs, [15, 9], [15, 9], slots=[0, 1])  # nothing new committed
    ctx.feats = torch.zeros(2, 1, ctx.feats.shape[-1])
    ctx.positions = ctx.start[:, None].clone()
    ctx.valid = torch.zeros(2, 1, dtype=torch.bool)
    ctx.next_tokens = torch.zeros(2, 1, dtype=torch.long)
    assert_same(d.propose(ctx, 3), first)
