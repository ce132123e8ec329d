"""Losslessness on the REAL demo bundle (`models/demo` + trained drafters).

- temperature 0: every drafter's output is token-identical to plain greedy decoding, 128 tokens per prompt
  (EOS ignored so every output is 128 tokens long), single-request and in a ragged batch with random
  per-row verification depth (D-Cut-like); the only tolerated difference is a near-tie
  (tests/lossless.py). The prompts: a pool of 24 held-out prompts, 8 per domain, interleaved
  chat/code/math. Each drafter configuration decodes its own 3 of them (one per domain; the seven
  configurations together cover 21 different prompts), the batched test decodes all 24 (DFly block 16,
  3 ragged batches of 8). Every prompt's greedy reference is decoded once per session and shared by
  every configuration (tests/demo.py).
- temperature > 0: the first two sampled tokens of one prompt over 800 seeds follow the target's exact
  distribution (enumerated once from the target's logits and shared; chi-square), for every registered
  drafter kind, with drafts sampled from the drafter (the default at T > 0), and with greedy drafts for
  one chain and one block drafter.

Skipped with a reason when the bundle or a drafter is not there yet.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
import torch

from engines.model import Transformer
from engines.sampling import SamplingParams, logits_to_probs
from engines.spec import SpecDecoder
from specroute.contracts.stats import AcceptanceStats
from tests.demo import Demo
from tests.lossless import assert_lossless

pytestmark = pytest.mark.e2e

N_TOKENS = 128
PER_DOMAIN = 8      # the prompt pool: 8 held-out prompts per domain, interleaved chat/code/math
PER_CONFIG = 3      # prompts a drafter configuration decodes: consecutive in the pool, so one per domain


def _configs() -> list[tuple[str, int | None, int | None]]:
    """Every registered drafter: autoregressive ones at their own maximum depth (k None), block drafters
    at block 16; plus DFly at block 8 (dfly block 16 also runs in the batched test)."""
    from engines.drafters.registry import DRAFTERS

    return [(kind, None if cls.autoregressive else 16, None if cls.autoregressive else 15)
            for kind, cls in DRAFTERS.items()] + [("dfly", 8, 7)]


CONFIGS = _configs()


@pytest.fixture(scope="module")
def prompts(demo: Demo) -> list[list[int]]:
    """The pool: PER_DOMAIN held-out prompts (<= 256 tokens) per domain, in the order chat, code, math,
    chat, ... so any PER_CONFIG consecutive ones hold one of each domain."""
    from engines.training.data import load_prompts

    items = load_prompts("heldout")
    random.Random(0).shuffle(items)
    by_domain: dict[str, list[list[int]]] = {"chat": [], "code": [], "math": []}
    for p in items:
        picked = by_domain.get(p.domain)
        if picked is not None and len(picked) < PER_DOMAIN:
            ids = demo.tok.encode_chat([{"role": "user", "content": p.prompt}])
            if len(ids) <= 256:
                picked.append(ids)
    assert all(len(v) == PER_DOMAIN for v in by_domain.values())
    assert len(CONFIGS) * PER_CONFIG <= 3 * PER_DOMAIN and PER_CONFIG % 3 == 0, "pool too small for the configs"
    return [by_domain[d][i] for i in range(PER_DOMAIN) for d in ("chat", "code", "math")]


def _spec_greedy(dec: SpecDecoder, slots: list[int], prompts: list[list[int]], k: int,
                 keep_fn: Callable[[], int] | None = None) -> list[list[int]]:
    outs = {s: [dec.prefill(s, p, SamplingParams())] for s, p in zip(slots, prompts, strict=True)}
    live = list(slots)
    while live:
        rows = dec.verify(live, dec.draft(live, k), [keep_fn() if keep_fn else k for _ in live])
        for s, r in zip(live, rows, strict=True):
            outs[s] += r
        live = [s for s in live if len(outs[s]) < N_TOKENS]
    for s in slots:
        dec.release(s)
    return [outs[s][:N_TOKENS] for s in slots]


@pytest.mark.parametrize(("j", "kind", "block", "k"), [(j, *c) for j, c in enumerate(CONFIGS)],
                         ids=[f"{c[0]}-{c[2] or 'max'}" for c in CONFIGS])
def test_greedy_speculative_equals_greedy_decoding(demo, prompts, j, kind, block, k):
    """Configuration j decodes prompts PER_CONFIG*j .. PER_CONFIG*(j+1)-1 of the pool: one per domain."""
    target = demo.target
    drafter = demo.drafter(kind, block)
    k = k or drafter.max_draft
    mine = range(j * PER_CONFIG, (j + 1) * PER_CONFIG)
    dec = SpecDecoder(target, drafter, 1, target.config.max_position_embeddings)
    ties, total = 0, AcceptanceStats()
    for i in mine:
        ids = prompts[i]
        got, st = _spec_one(dec, ids, k)
        total = total.merge(st)
        res = assert_lossless(target, ids, got, demo.greedy(ids, N_TOKENS), label=f"{kind} k={k} prompt {i}")
        ties += 0 if res.identical else 1
    tau = total.mean_accepted_length
    print(f"{kind} k={k}: prompts {list(mine)} x {N_TOKENS} tokens lossless ({ties} near-ties), tau={tau:.2f}")
    assert tau > 1.3, f"{kind} accepts almost nothing (mean accepted length {tau:.2f})"


def _spec_one(dec: SpecDecoder, ids: list[int], k: int) -> tuple[list[int], AcceptanceStats]:
    out = [dec.prefill(0, ids, SamplingParams())]
    while len(out) < N_TOKENS:
        out += dec.verify([0], dec.draft([0], k), [k])[0]
    st = dec.stats(0)
    dec.release(0)
    return out[:N_TOKENS], st


def test_batched_ragged_speculative_equals_greedy_decoding(demo, prompts):
    target = demo.target
    dec = SpecDecoder(target, demo.drafter("dfly", 16), 8, target.config.max_position_embeddings)
    g = random.Random(1)
    for start in range(0, len(prompts), 8):   # 3 ragged batches of 8, every prompt of the pool
        batch = prompts[start:start + 8]
        got = _spec_greedy(dec, list(range(len(batch))), batch, 15, keep_fn=lambda: g.randint(0, 15))
        for j, (ids, row) in enumerate(zip(batch, got, strict=True)):
            assert_lossless(target, ids, row, demo.greedy(ids, N_TOKENS), label=f"batched prompt {start + j}")


# --- temperature > 0 ----------------------------------------------------------------------------

def _exact_pair_distribution(target: Transformer, ids: list[int], temperature: float, top_p: float,
                             min_p1: float = 1e-4) -> tuple[dict[tuple[int, int], float], set[int]]:
    """Exact P(x1, x2) > 0 for every x1 with P(x1) >= min_p1 (one batched forward over those prefixes).
    Returns the cells and the set of first tokens enumerated."""
    with torch.no_grad():
        h = target(torch.tensor([ids]), torch.arange(len(ids))[None]).hidden
        p1 = logits_to_probs(target.logits(h[0, -1]), temperature, top_p)
        firsts = (p1 >= min_p1).nonzero().squeeze(1)
        seqs = torch.tensor(ids)[None].expand(len(firsts), -1)
        seqs = torch.cat([seqs, firsts[:, None]], dim=1)
        h2 = target(seqs, torch.arange(seqs.shape[1]).expand_as(seqs)).hidden
        p2 = logits_to_probs(target.logits(h2[:, -1]), temperature, top_p)   # [F, V]
    joint = p1[firsts, None].double() * p2.double()                              # [F, V]
    i, x2 = joint.nonzero(as_tuple=True)
    cells = dict(zip(zip(firsts[i].tolist(), x2.tolist(), strict=True), joint[i, x2].tolist(), strict=True))
    return cells, set(firsts.tolist())


def _chi2_pvalue(observed: list[float], expected: list[float]) -> float:
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    dof = sum(1 for e in expected if e > 0) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _assert_follows(counts: dict[tuple[int, int], int], n: int, cells: dict[tuple[int, int], float],
                    enumerated: set[int], label: str) -> None:
    """`n` sampled first-token pairs (`counts`) against the exact distribution `cells`: no pair the
    target cannot produce, and a chi-square test (cells expected >= 5 on their own, the rest pooled)."""
    impossible = [key for key in counts if key[0] in enumerated and key not in cells]
    assert not impossible, f"{label}: sampled pairs the target cannot produce: {impossible[:5]}"
    big = [key for key, p in cells.items() if p * n >= 5]
    obs = [counts.get(key, 0) for key in big]
    exp = [cells[key] * n for key in big]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    pval = _chi2_pvalue(obs, exp)
    print(f"{label}: {len(big)} cells + pooled, chi-square p = {pval:.3f}")
    assert pval > 1e-3, f"{label}: speculative samples differ from the target's distribution (p={pval:.2e})"


def _hot_configs() -> list[tuple[str, bool]]:
    """Every registered drafter kind (read at collection time), with greedy and with sampled drafts."""
    from engines.drafters.registry import DRAFTERS

    # sampled drafts for every kind; greedy drafts (q one-hot, also covered exactly by the enumeration
    # tests in test_verify.py) for one chain and one block drafter, to keep `make test` inside its budget
    return [(kind, True) for kind in DRAFTERS] + [(kind, False) for kind in ("mtp", "dflash") if kind in DRAFTERS]


TEMPERATURE, TOP_P = 1.0, 0.95


@pytest.fixture(scope="module")
def hot(demo: Demo) -> tuple[list[int], dict[tuple[int, int], float], set[int]]:
    """The prompt of the T > 0 tests and its exact first-two-token distribution (enumerated once for
    every drafter kind and drafting mode: it depends on the target only)."""
    ids = demo.tok.encode_chat([{"role": "user", "content": "Tell me a story."}])
    return (ids, *_exact_pair_distribution(demo.target, ids, TEMPERATURE, TOP_P))


@pytest.mark.parametrize(("kind", "sample_drafts"), _hot_configs(),
                         ids=[f"{k}-{'sampled' if s else 'greedy'}-drafts" for k, s in _hot_configs()])
def test_sampled_first_tokens_follow_the_target_distribution(demo, hot, kind, sample_drafts):
    """Two drafts a step (the first two tokens cover an accepted draft, a rejection's residual and the
    bonus), drafted greedily (q one-hot) or sampled from the drafter's q at the request's temperature
    and top-p (block drafters: every slot of the parallel block sampled from its own q_i)."""
    target = demo.target
    temperature, top_p, n, k = TEMPERATURE, TOP_P, 800, 2   # 800 draws for every kind x drafting mode
    ids, cells, enumerated = hot
    slots = 100
    dec = SpecDecoder(target, demo.drafter(kind), slots, len(ids) + 64, sample_drafts=sample_drafts)
    torch.manual_seed(0)   # unseeded rows (rejection sampling; a seed selects the Gumbel rule): their generators
    counts = _pair_counts(dec, ids, n, k, lambda s: SamplingParams(temperature, top_p))
    _assert_follows(counts, n, cells, enumerated, kind)


def _pair_counts(dec: SpecDecoder, ids: list[int], n: int, k: int, params: Callable[[int], SamplingParams],
                 modes: list[str | None] | None = None) -> dict[tuple[int, int], int]:
    """The first two tokens of `n` samples of `ids`, decoded in batches of every slot of `dec` (draw i
    with `params(i)`, slot s in `modes[s]`), drafting k tokens a step: pair -> count."""
    slots = dec.num_slots
    counts: dict[tuple[int, int], int] = {}
    for base in range(0, n, slots):
        firsts = dec.prefill_batch(list(range(slots)), [ids] * slots, [params(base + s) for s in range(slots)], modes)
        outs = {s: [y] for s, y in enumerate(firsts)}
        live = list(range(slots))
        while live:
            rows = dec.verify(live, dec.draft(live, k), [k] * len(live))
            for s, r in zip(live, rows, strict=True):
                outs[s] += r
            live = [s for s in live if len(outs[s]) < 2]
        for s in range(slots):
            key = (outs[s][0], outs[s][1])
            counts[key] = counts.get(key, 0) + 1
            dec.release(s)
    return counts


@pytest.mark.parametrize("kind", ["mtp", "dfly", "dspark"])
def test_mixed_temperature_batch_samples_each_row_exactly(demo, hot, kind):
    """A batch mixing greedy rows, rows at (T=0.7, top-p 0.9) and rows at the tests' (T=1, top-p 0.95)
    is drafted by ONE drafter call, each row from q at its own settings (greedy rows: one-hot q). The
    T=1 rows and the T=0.7 rows each follow the target's exact two-token distribution at their own
    settings, and the greedy rows stay greedy. (mtp: a chain; dfly and dspark: block drafters whose
    greedy and sampled drafting take different paths.)"""
    target = demo.target
    ids, cells, enumerated = hot
    warm_cells, warm_enumerated = _exact_pair_distribution(target, ids, 0.7, 0.9)
    greedy = demo.greedy(ids, 2)
    hot_rows, n_greedy, n_warm, k = 50, 10, 40, 2
    slots = hot_rows + n_greedy + n_warm
    dec = SpecDecoder(target, demo.drafter(kind), slots, len(ids) + 64)
    counts: dict[tuple[int, int], int] = {}
    warm: dict[tuple[int, int], int] = {}
    n = 0
    for base in range(0, 600, hot_rows):
        torch.manual_seed(base)   # unseeded rows (rejection sampling): their generators' seeds
        params = ([SamplingParams(TEMPERATURE, TOP_P) for s in range(hot_rows)]
                  + [SamplingParams()] * n_greedy
                  + [SamplingParams(0.7, 0.9) for s in range(n_warm)])
        firsts = dec.prefill_batch(list(range(slots)), [ids] * slots, params)
        outs = {s: [y] for s, y in enumerate(firsts)}
        live = list(range(slots))
        while live:
            proposal = dec.draft(live, k)
            assert proposal is not None and proposal.probs is not None   # merged: sampled rows carry q
            rows = dec.verify(live, proposal, [k] * len(live))
            for s, r in zip(live, rows, strict=True):
                outs[s] += r
            live = [s for s in live if len(outs[s]) < 2]
        for s in range(slots):
            if s < hot_rows:
                counts[(outs[s][0], outs[s][1])] = counts.get((outs[s][0], outs[s][1]), 0) + 1
                n += 1
            elif s < hot_rows + n_greedy:
                assert_lossless(target, ids, outs[s][:2], greedy[:2], label=f"{kind} greedy row {s} of a mixed batch")
            else:
                warm[(outs[s][0], outs[s][1])] = warm.get((outs[s][0], outs[s][1]), 0) + 1
            dec.release(s)
    _assert_follows(counts, n, cells, enumerated, f"{kind} (mixed batch, T=1)")
    _assert_follows(warm, sum(warm.values()), warm_cells, warm_enumerated, f"{kind} (mixed batch, T=0.7 top-p 0.9)")


# --- several modes over one target (a multi-mode worker) -------------------------------------------

def _modes(demo: Demo) -> dict[str, object]:
    return {"mtp": demo.drafter("mtp"), "dfly": demo.drafter("dfly", 16), "ar": None}


def test_multi_mode_batch_equals_greedy_decoding(demo, prompts):
    """MTP, DFly (block 16) and plain rows in one batch, every step drafting with each row's own
    drafter and verifying split by a CPU-like cost model (15 tokens: `width_groups`): every row equals
    plain greedy decoding. (The per-step drafter choice is driven at random in test_spec_modes.py.)"""
    from engines.step import verify_groups, width_groups

    target = demo.target
    dec = SpecDecoder(target, None, 6, target.config.max_position_embeddings, modes=_modes(demo))
    batch = prompts[:6]
    modes = ["mtp", "dfly", "ar", "dfly", "ar", "mtp"]   # every domain in every mode across the pool order
    outs = {s: [dec.prefill_batch([s], [p], [SamplingParams()], [m])[0]]
            for s, (p, m) in enumerate(zip(batch, modes, strict=True))}
    live = list(range(6))
    while live:
        proposal = dec.draft(live, 15)   # None once only plain rows are left
        limits = proposal.limits() if proposal is not None else [0] * len(live)
        keep = [max(0, min(w, N_TOKENS - len(outs[s]) - 1)) for w, s in zip(limits, live, strict=True)]
        groups = width_groups(keep, int(proposal.tokens.shape[1]) if proposal is not None else 0, 15.0)
        for s, row in zip(live, verify_groups(dec, live, proposal, keep, groups), strict=True):
            outs[s] += row
        live = [s for s in live if len(outs[s]) < N_TOKENS]
    for s, (ids, mode) in enumerate(zip(batch, modes, strict=True)):
        assert_lossless(target, ids, outs[s][:N_TOKENS], demo.greedy(ids, N_TOKENS), label=f"{mode} row {s}")
    assert dec.stats(1).mean_accepted_length > 1.3 and dec.stats(2).drafted == 0


def test_multi_mode_sampled_rows_follow_the_target_distribution(demo, hot):
    """T=1 rows drafted by MTP, by DFly and by nobody, in one batch: every row follows the target's
    exact two-token distribution (600 draws pooled, 200 per mode)."""
    target = demo.target
    ids, cells, enumerated = hot
    slots, k = 60, 2
    dec = SpecDecoder(target, None, slots, len(ids) + 64, modes=_modes(demo))
    modes: list[str | None] = [("mtp", "dfly", "ar")[s % 3] for s in range(slots)]
    counts = _pair_counts(dec, ids, 600, k, lambda s: SamplingParams(TEMPERATURE, TOP_P, seed=s), modes)   # seeded: Gumbel rule
    _assert_follows(counts, 600, cells, enumerated, "mtp + dfly + ar rows (one batch)")
