"""Losslessness on the REAL demo bundle (`models/demo` + trained drafters).

- temperature 0: every drafter's output is token-identical to plain greedy decoding for 50 held-out
  prompts across chat/code/math, 128 tokens each (EOS ignored so every output is 128 tokens long),
  single-request and in a ragged batch with random per-row verification depth (D-Cut-like); the only
  tolerated difference is a near-tie (tests/lossless.py).
- temperature > 0: the first two sampled tokens of one prompt over 2000 seeds follow the target's exact
  distribution (enumerated from the target's logits; chi-square), for every registered drafter kind,
  with greedy drafts and with drafts sampled from the drafter (the default at T > 0).

Skipped with a reason when the bundle or a drafter is not there yet.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from engines.generate import decode_one, prefill
from engines.model import KVCache, Transformer, load_model
from engines.sampling import SamplingParams, logits_to_probs
from engines.spec import SpecDecoder
from engines.tokenizer import Tokenizer
from specroute.contracts.stats import AcceptanceStats
from tests.lossless import assert_lossless

pytestmark = pytest.mark.e2e

BUNDLE = Path(__file__).resolve().parents[2] / "models" / "demo"
N_PROMPTS, N_TOKENS = 50, 128

def _configs() -> list[tuple[str, int | None, int | None]]:
    """Every registered drafter: autoregressive ones at their own maximum depth (k None), block drafters
    at block 16; plus DFly at block 8 (dfly block 16 also runs in the batched test)."""
    from engines.drafters.registry import DRAFTERS

    return [(kind, None if cls.autoregressive else 16, None if cls.autoregressive else 15)
            for kind, cls in DRAFTERS.items()] + [("dfly", 8, 7)]


CONFIGS = _configs()


@pytest.fixture(scope="module")
def bundle():
    if not (BUNDLE / "config.json").is_file() or not list(BUNDLE.glob("model*.safetensors")):
        pytest.skip(f"demo target not trained yet ({BUNDLE}/config.json missing)")
    torch.set_num_threads(1)
    return load_model(BUNDLE), Tokenizer.load(BUNDLE)


def _drafter(kind: str, block: int | None, target: Transformer):
    if not (BUNDLE / "drafters" / kind / "config.json").is_file():
        pytest.skip(f"{kind} drafter not trained yet ({BUNDLE}/drafters/{kind} missing)")
    from engines.drafters.registry import load_drafter

    return load_drafter(kind, BUNDLE, target, block_size=block)


@pytest.fixture(scope="module")
def prompts(bundle):
    from engines.training.data import load_prompts

    _, tok = bundle
    items = load_prompts("heldout")
    random.Random(0).shuffle(items)
    per = {"chat": 17, "code": 17, "math": 16}
    out: list[list[int]] = []
    for p in items:
        if per.get(p.domain, 0) > 0:
            ids = tok.encode_chat([{"role": "user", "content": p.prompt}])
            if len(ids) <= 256:
                out.append(ids)
                per[p.domain] -= 1
    assert len(out) == N_PROMPTS
    return out


@pytest.fixture(scope="module")
def greedy_refs(bundle, prompts):
    """Plain greedy decoding (engines.generate primitives), N_TOKENS each, EOS ignored."""
    target, _ = bundle
    refs = []
    for ids in prompts:
        cache = KVCache.for_model(target.config, 1, len(ids) + N_TOKENS + 1)
        logits = target.logits(prefill(target, cache, 0, ids).hidden[0, -1])
        toks = []
        for i in range(N_TOKENS):
            toks.append(int(logits.argmax()))
            if i < N_TOKENS - 1:
                logits = decode_one(target, cache, 0, toks[-1])
        refs.append(toks)
    return refs


def _spec_greedy(dec: SpecDecoder, slots: list[int], prompts: list[list[int]], k: int,
                 keep_fn=None) -> list[list[int]]:
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


@pytest.mark.parametrize(("kind", "block", "k"), CONFIGS, ids=[f"{c[0]}-{c[2] or 'max'}" for c in CONFIGS])
def test_greedy_speculative_equals_greedy_decoding(bundle, prompts, greedy_refs, kind, block, k):
    target, _ = bundle
    drafter = _drafter(kind, block, target)
    k = k or drafter.max_draft
    dec = SpecDecoder(target, drafter, 1, target.config.max_position_embeddings)
    ties, total = 0, AcceptanceStats()
    for i, (ids, ref) in enumerate(zip(prompts, greedy_refs, strict=True)):
        got, st = _spec_one(dec, ids, k)
        total = total.merge(st)
        res = assert_lossless(target, ids, got, ref, label=f"{kind} k={k} prompt {i}")
        ties += 0 if res.identical else 1
    tau = total.mean_accepted_length
    print(f"{kind} k={k}: {N_PROMPTS} prompts x {N_TOKENS} tokens lossless ({ties} near-ties), tau={tau:.2f}")
    assert tau > 1.3, f"{kind} accepts almost nothing (mean accepted length {tau:.2f})"


def _spec_one(dec: SpecDecoder, ids: list[int], k: int) -> tuple[list[int], AcceptanceStats]:
    out = [dec.prefill(0, ids, SamplingParams())]
    while len(out) < N_TOKENS:
        out += dec.verify([0], dec.draft([0], k), [k])[0]
    st = dec.stats(0)
    dec.release(0)
    return out[:N_TOKENS], st


def test_batched_ragged_speculative_equals_greedy_decoding(bundle, prompts, greedy_refs):
    target, _ = bundle
    dec = SpecDecoder(target, _drafter("dfly", 16, target), 8, target.config.max_position_embeddings)
    g = random.Random(1)
    for start in range(0, 24, 8):   # 3 ragged batches of 8 (the single-request tests cover all 50)
        batch = prompts[start:start + 8]
        got = _spec_greedy(dec, list(range(len(batch))), batch, 15, keep_fn=lambda: g.randint(0, 15))
        for j, (ids, row) in enumerate(zip(batch, got, strict=True)):
            assert_lossless(target, ids, row, greedy_refs[start + j], label=f"batched prompt {start + j}")


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


def _hot_configs() -> list[tuple[str, bool]]:
    """Every registered drafter kind (read at collection time), with greedy and with sampled drafts."""
    from engines.drafters.registry import DRAFTERS

    # sampled drafts for every kind; greedy drafts (q one-hot, also covered exactly by the enumeration
    # tests in test_verify.py) for one chain and one block drafter, to keep `make test` inside its budget
    return [(kind, True) for kind in DRAFTERS] + [(kind, False) for kind in ("mtp", "dflash") if kind in DRAFTERS]


@pytest.mark.parametrize(("kind", "sample_drafts"), _hot_configs(),
                         ids=[f"{k}-{'sampled' if s else 'greedy'}-drafts" for k, s in _hot_configs()])
def test_sampled_first_tokens_follow_the_target_distribution(bundle, kind, sample_drafts):
    """Two drafts a step (the first two tokens cover an accepted draft, a rejection's residual and the
    bonus), drafted greedily (q one-hot) or sampled from the drafter's q at the request's temperature
    and top-p (block drafters: every slot of the parallel block sampled from its own q_i)."""
    target, tok = bundle
    temperature, top_p, n, k = 1.0, 0.95, 800, 2   # 800 draws a kind: every kind x drafting mode runs in make test
    ids = tok.encode_chat([{"role": "user", "content": "Tell me a story."}])
    cells, enumerated = _exact_pair_distribution(target, ids, temperature, top_p)
    slots = 100
    dec = SpecDecoder(target, _drafter(kind, None, target), slots, len(ids) + 64, sample_drafts=sample_drafts)
    counts: dict[tuple[int, int], int] = {}
    for base in range(0, n, slots):
        firsts = dec.prefill_batch(list(range(slots)), [ids] * slots,
                                   [SamplingParams(temperature, top_p, seed=base + s) for s in range(slots)])
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
    impossible = [key for key in counts if key[0] in enumerated and key not in cells]
    assert not impossible, f"sampled pairs the target (top-p {top_p}) cannot produce: {impossible[:5]}"
    # cells expected >= 5 on their own; everything else pooled into one cell
    big = [key for key, p in cells.items() if p * n >= 5]
    obs = [counts.get(key, 0) for key in big]
    exp = [cells[key] * n for key in big]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    pval = _chi2_pvalue(obs, exp)
    print(f"{kind}: {len(big)} cells + pooled, chi-square p = {pval:.3f}")
    assert pval > 1e-3, f"{kind}: speculative samples differ from the target's distribution (p={pval:.2e})"
