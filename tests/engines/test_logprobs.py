"""Logprobs of emitted tokens (engines/logprobs.py): the processed distribution's (temperature, top-p),
the raw target's at T=0, and the same for a token whether it was an accepted draft, a correction or
a plain step's: AR, an oracle chain drafter, the real MTP and DFly drafters (random weights, narrowed
draft vocabulary so drafts are accepted and rejected), a tree drafter (EAGLE-3, whose random drafts are rejected), with full and with
random per-row verification depth (what D-Cut's keep does), and through the batcher under a real D-Cut
controller, on a tiny random target. Cost: ~12 s."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.generate import ar_generate
from engines.logprobs import FLOOR, TokenLogprob, processed_logprobs, take, token_logprobs
from engines.requests import GenRequest
from engines.sampling import SamplingParams, logits_to_probs
from engines.spec import SpecDecoder
from tests.engines.test_batcher import EOS, make_drafter, run_batch
from tests.engines.test_spec import CharTok, make_target, oracle_decoder, prompts

N = 20
TOP = 3
GREEDY_LP = SamplingParams(logprobs=TOP)
SEEDED_LP = SamplingParams(temperature=0.9, top_p=0.8, seed=11, logprobs=TOP)


def test_processed_logprobs_follow_temperature_and_top_p():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    raw = processed_logprobs(logits, SamplingParams())
    assert torch.allclose(raw, torch.log_softmax(logits, -1))
    hot = processed_logprobs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(hot, torch.log_softmax(logits / 0.5, -1))
    nucleus = processed_logprobs(logits, SamplingParams(temperature=0.7, top_p=0.5))
    p = logits_to_probs(logits, 0.7, 0.5)
    assert torch.allclose(nucleus[p > 0], torch.log(p[p > 0]))
    assert bool((nucleus[p == 0] == FLOOR).all()) and bool((p == 0).any())
    tok = token_logprobs(logits, [1, 2, 3], SamplingParams(), 5)
    assert [t.token_id for t in tok] == [1, 2, 3] and all(len(t.top) == 5 for t in tok)
    best = raw[0].argmax().item()
    assert tok[0].top[0] == (best, pytest.approx(raw[0, best].item()))
    assert tok[0].logprob == pytest.approx(raw[0, 1].item())
    assert [t.top for t in token_logprobs(logits, [1], SamplingParams(), 0)] == [()]


ACCEPTED: list[int] = []   # drafts accepted by each `_decode` (the test checks drafts were taken)


def _decode(dec: SpecDecoder, prompt: list[int], params: SamplingParams, k: int,
            keep: Callable[[], int]) -> tuple[list[int], list[TokenLogprob]]:
    """One request through draft/verify steps until N tokens; its tokens and the logprobs queued for them."""
    out = [dec.prefill(0, prompt, params)]
    while len(out) < N:
        out += dec.verify([0], dec.draft([0], k), [keep()])[0]
    lps = take(dec.slots[0].logprobs, len(out))
    ACCEPTED.append(dec.slots[0].stats.accepted)
    dec.release(0)
    return out[:N], lps[:N]


def _same(got: tuple[list[int], list[TokenLogprob]], ref: tuple[list[int], list[TokenLogprob]], label: str) -> None:
    assert got[0] == ref[0], label
    for a, b in zip(got[1], ref[1], strict=True):
        assert a.token_id == b.token_id
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4), (label, a, b)
        assert [t for t, _ in a.top] == [t for t, _ in b.top], label
        assert all(math.isclose(x, y, abs_tol=1e-4) for (_, x), (_, y) in zip(a.top, b.top, strict=True)), label


def _narrowed(kind: str, target, block: int, prompt: list[int]):
    """A real drafter (random weights) whose draft vocabulary is the target's two commonest greedy tokens
    here, so its proposals are accepted some of the time and rejected the rest."""
    registry = pytest.importorskip("engines.drafters.registry")
    cfg = {} if registry.DRAFTERS[kind].autoregressive else {"block_size": block}
    drafter = registry.new_drafter(kind, target, **cfg).eval()
    ref = ar_generate(target, CharTok(), prompt, SamplingParams(), max_tokens=N, max_len=128).token_ids
    if drafter.supports_dcut:   # a chain (a tree's top-k needs more than two tokens)
        drafter.set_draft_vocab(torch.tensor([t for t, _ in Counter(ref).most_common(2)]))
    return drafter


@pytest.mark.parametrize("params", [GREEDY_LP, SEEDED_LP], ids=["greedy", "seeded-sampled"])
def test_a_tokens_logprobs_do_not_depend_on_how_it_was_drafted(params):
    target = make_target()
    prompt = prompts(1, seed=5, lo=6, hi=12)[0]
    ar = _decode(SpecDecoder(target, None, 1, 128), prompt, params, 0, lambda: 0)
    assert len(ar[1]) == N and all(len(t.top) == TOP for t in ar[1])
    g = torch.Generator().manual_seed(3)
    random_keep = lambda: int(torch.randint(0, 5, (1,), generator=g))   # noqa: E731  (D-Cut's per-row depth)
    ACCEPTED.clear()
    for corrupt in (0.0, 0.4):
        dec = oracle_decoder(target, 1, 128, corrupt=corrupt, k_max=4)
        _same(_decode(dec, prompt, params, 4, lambda: 4), ar, f"oracle {corrupt}")
        _same(_decode(dec, prompt, params, 4, random_keep), ar, f"oracle {corrupt} random keep")
    for kind, block in (("mtp", 0), ("dfly", 8), ("eagle3", 0)):
        drafter = _narrowed(kind, target, block, prompt)
        dec = SpecDecoder(target, drafter, 1, 128)
        k = min(drafter.max_draft, 7)
        _same(_decode(dec, prompt, params, k, lambda k=k: k), ar, kind)
        if drafter.supports_dcut:
            _same(_decode(dec, prompt, params, k, random_keep), ar, f"{kind} random keep")
    oracle, mtp, dfly = ACCEPTED[0], ACCEPTED[4] + ACCEPTED[5], ACCEPTED[6] + ACCEPTED[7]
    if params.greedy:   # drafted tokens really were compared (seeded rows accept greedy drafts less often)
        assert oracle >= N // 2 and mtp > 0 and dfly > 0, ACCEPTED
    assert sum(ACCEPTED) > 0


def test_rows_without_logprobs_queue_nothing_and_batched_rows_get_their_own():
    target = make_target()
    ps = prompts(2, seed=7)
    dec = oracle_decoder(target, 2, 128, corrupt=0.3, k_max=4)
    dec.prefill(0, ps[0], SamplingParams())
    dec.prefill(1, ps[1], GREEDY_LP)
    rows = dec.verify([0, 1], dec.draft([0, 1], 4), [4, 2])
    assert dec.slots[0].logprobs == []
    assert [t.token_id for t in dec.slots[1].logprobs][1:] == rows[1]


@pytest.mark.parametrize("kind", ["mtp", "dfly"])
def test_batched_requests_under_dcut_get_the_ar_logprobs_of_their_tokens(kind):
    """Through the batcher (stop handling, EOS left out) with a real D-Cut controller (a synthetic cost
    table: it verifies a chosen prefix of each row's drafts), against the AR batcher's."""
    target = make_target(0, eos_token_id=EOS)
    ps = prompts(6, seed=9)
    reqs = [GenRequest(p, GREEDY_LP if i % 2 else SEEDED_LP, max_tokens=12, request_id=str(i)) for i, p in enumerate(ps)]
    _, ar = run_batch(target, None, reqs)
    drafter = make_drafter(kind, target)
    dcut = DcutController(CostTable.linear(drafter.max_draft, base_ms=1.0, per_token_ms=0.5), drafter.max_draft)
    b, spec = run_batch(target, drafter, reqs, dcut=dcut)
    assert b.draft_steps > 0
    for got, ref in zip(spec, ar, strict=True):
        ids = [t for e in ref.events for t in e.token_ids if t != EOS]
        lps = [lp for e in ref.events for lp in e.logprobs or ()]
        assert [lp.token_id for lp in lps] == ids and len(ids) > 0
        _same((ids, [lp for e in got.events for lp in e.logprobs or ()]), (ids, lps), kind)
