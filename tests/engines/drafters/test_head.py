"""The drafting head: draft vocabularies (choice, storage, what drafters may propose) and the bf16
copy, which change drafting speed only: greedy speculative output stays plain greedy decoding."""

from __future__ import annotations

import json

import pytest
import torch

from engines.drafters.head import DraftHead, draft_vocab_from_counts, pick_tokens
from engines.drafters.registry import load_drafter, save_drafter
from engines.generate import ar_generate
from engines.sampling import SamplingParams, logits_to_probs
from engines.spec import SpecDecoder
from specroute.errors import UserError

from .test_drafters import KINDS, MAX_LEN, TINY, context, make_drafter, make_target, sequences


def test_draft_vocab_from_counts_keeps_the_most_frequent_and_the_forced_ids():
    counts = torch.tensor([0, 5, 1, 9, 9, 0, 3, 7])
    assert draft_vocab_from_counts(counts, 3).tolist() == [3, 4, 7]
    assert draft_vocab_from_counts(counts, 3, always=[0]).tolist() == [0, 3, 4]   # ties: lower id first
    assert draft_vocab_from_counts(counts, 8).tolist() == list(range(8))
    assert draft_vocab_from_counts(counts, 0).tolist() == list(range(8))


def test_pick_tokens_with_per_row_settings_matches_one_call_per_setting():
    """Per-row temperature and top-p ([B]) let greedy and sampled rows share one drafting call: a greedy
    row gets the argmax, its confidence and a one-hot q; a sampled row gets q at its own settings, the
    same distribution as a call with that row's scalars (top-p 1: no truncation)."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    temperature, top_p = torch.tensor([0.0, 0.7, 1.0, 0.0]), torch.tensor([1.0, 0.9, 1.0, 1.0])
    tok, conf, probs = pick_tokens(logits, temperature, top_p, True, torch.Generator().manual_seed(1))
    assert probs is not None
    for b in (0, 3):   # greedy rows
        p = torch.softmax(logits[b], -1)
        assert int(tok[b]) == int(p.argmax()) and torch.isclose(conf[b], p.max())
        assert torch.equal(probs[b], torch.nn.functional.one_hot(tok[b], 50).float())
    for b in (1, 2):   # sampled rows: q at the row's own settings, and its largest probability as confidence
        q = logits_to_probs(logits[b:b + 1], float(temperature[b]), float(top_p[b]))[0]
        assert torch.allclose(probs[b], q, atol=1e-6) and float(q[tok[b]]) > 0 and torch.isclose(conf[b], q.max())
    assert int((probs[1] > 0).sum()) < 50 == int((probs[2] > 0).sum())   # top-p 0.9 truncates row 1 only
    none = pick_tokens(logits, torch.zeros(4), torch.ones(4), True, None)   # every row greedy: no q at all
    assert none[2] is None and torch.equal(none[0], logits.argmax(-1))
    off = pick_tokens(logits, temperature, top_p, False, None)   # a drafter that does not sample: greedy
    assert off[2] is None


def test_draft_head_maps_indices_and_distributions_back_to_the_vocabulary():
    w = torch.randn(10, 4)
    head = DraftHead.build(w, torch.tensor([1, 4, 7]), torch.float32)
    h = torch.randn(2, 4)
    torch.testing.assert_close(head.logits(h), h @ w[[1, 4, 7]].T)
    assert head.tokens(torch.tensor([0, 2])).tolist() == [1, 7]
    full = head.full_probs(torch.tensor([[0.2, 0.3, 0.5]]))
    assert full.shape == (1, 10) and full[0, [1, 4, 7]].tolist() == pytest.approx([0.2, 0.3, 0.5])
    assert float(full.sum()) == pytest.approx(1.0)
    half = DraftHead.build(w, None, torch.bfloat16)
    assert (half.narrow if half.narrow is not None else half.weight).dtype == torch.bfloat16


def test_the_bf16_copy_is_read_where_it_is_the_faster_product(monkeypatch):
    """Native bf16: one bf16 copy, always read. Emulated: the target's rows for products over several
    rows, the bf16 copy for one or two (memory-bound, half the bytes)."""
    import engines.drafters.head as head_mod

    w = torch.randn(10, 4)
    for native in (True, False):
        monkeypatch.setattr(head_mod, "bf16_is_native", lambda native=native: native)
        monkeypatch.setattr(head_mod, "bf16_pays", lambda rows, native=native: native or rows <= 2)
        head = DraftHead.build(w, torch.tensor([1, 4, 7]), torch.bfloat16)
        assert head.narrow is not None and head.weight.dtype == (torch.bfloat16 if native else torch.float32)
        one, many = torch.randn(1, 4), torch.randn(8, 4)
        torch.testing.assert_close(head.logits(one), (one.bfloat16() @ head.narrow.T).float())
        want = (many.bfloat16() @ head.narrow.T).float() if native else many @ w[[1, 4, 7]].T
        torch.testing.assert_close(head.logits(many), want)


VOCAB = torch.tensor(sorted({0, 1, 2, *range(3, TINY.vocab_size, 3)}))   # ~1/3 of the vocabulary


def restricted(kind: str):
    target = make_target()
    d = make_drafter(kind, target)
    d.set_draft_vocab(VOCAB)
    return target, d


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_restricted_drafter_proposes_only_draft_vocabulary_tokens(kind):
    target, d = restricted(kind)
    assert d.cfg.draft_vocab_size == len(VOCAB)
    d.allocate(2, MAX_LEN)
    ctx = context(target, d, sequences([12, 9]), [0, 0], [10, 7], slots=[0, 1])
    p = d.propose(ctx, 4)
    assert torch.isin(p.tokens, VOCAB).all()
    d.sample_drafts = True
    d.allocate(2, MAX_LEN)
    ctx = context(target, d, sequences([12, 9]), [0, 0], [10, 7], slots=[0, 1])
    p = d.propose(ctx, 3, temperature=0.9, top_p=1.0, generator=torch.Generator().manual_seed(0))
    if p.parents is not None:   # tree drafts stay top-k (deterministic) at any temperature
        assert p.probs is None and torch.isin(p.tokens, VOCAB).all()
        return
    assert p.probs is not None and p.probs.shape[-1] == TINY.vocab_size
    outside = torch.ones(TINY.vocab_size, dtype=torch.bool)
    outside[VOCAB] = False
    assert float(p.probs[..., outside].abs().sum()) == 0.0
    torch.testing.assert_close(p.probs.sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(p.probs.max(-1).values, p.conf)   # known before the draft is drawn


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_restricted_bf16_drafting_stays_lossless(kind):
    target, d = restricted(kind)
    d.configure_head(torch.bfloat16)
    dec = SpecDecoder(target, d, num_slots=1, max_len=MAX_LEN)
    for prompt in sequences([9, 14, 5], seed=11):
        ref = ar_generate(target, _Tok(), prompt, SamplingParams(), max_tokens=24, max_len=MAX_LEN).token_ids
        y = [dec.prefill(0, prompt, SamplingParams())]
        while len(y) < 24:
            y += dec.verify([0], dec.draft([0], 3), [3])[0]
        dec.release(0)
        assert y[:24] == ref


@pytest.mark.parametrize("kind", KINDS)
def test_draft_vocabulary_round_trips_and_mismatches_are_user_errors(kind, tmp_path):
    target, d = restricted(kind)
    out = save_drafter(d, tmp_path / "drafters" / kind)
    loaded = load_drafter(kind, tmp_path, target)
    assert torch.equal(loaded.draft_vocab, VOCAB) and loaded.head_dtype == torch.bfloat16
    assert loaded.draft_head.size == len(VOCAB)
    cfg = json.loads((out / "config.json").read_text())
    cfg["draft_vocab_size"] = 5
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="draft vocabulary"):
        load_drafter(kind, tmp_path, target)


class _Tok:
    """Enough of a tokenizer for `ar_generate` (no stop strings)."""

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))
