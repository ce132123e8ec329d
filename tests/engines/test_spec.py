"""SpecDecoder and spec_generate on a tiny random target: token-exact against plain greedy decoding
(single requests, ragged batches, random per-row keep), stop/EOS/max-tokens inside an accepted block,
context-limit edge cases, stats, and the real drafters' plumbing (random weights)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from torch import Tensor

from engines.drafters.base import DraftContext, Drafter, Proposal
from engines.errors import ContextFull, DrafterMismatch, EmptyPrompt, PromptTooLong
from engines.generate import ar_generate
from engines.lossless import check_lossless
from engines.model import ForwardOut, ModelConfig, Transformer, init_weights
from engines.sampling import SamplingParams
from engines.slots import backlog_groups
from engines.spec import SpecDecoder
from engines.spec_generate import spec_generate
from tests.lossless import assert_lossless

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
GREEDY = SamplingParams()


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class CharTok:
    """Test double for `Tokenizer.decode`: token i -> one printable character."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(chr(48 + i % 75) for i in ids)


def make_target(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(dataclasses.replace(TINY, **overrides))
    init_weights(model, std=0.2, num_layers=TINY.num_hidden_layers)
    return model.eval()


def prompts(n: int, seed: int = 1, lo: int = 3, hi: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, TINY.vocab_size, (m,), generator=g).tolist() for m in lens]


class OracleDrafter(Drafter):
    """Test double: proposes the target's own greedy continuation (computed in the decoder's cache,
    in the speculative zone past the committed length), corrupting each token with probability
    `corrupt`, so full acceptance, partial acceptance and immediate rejection all occur. It also
    checks the DraftContext plumbing: contiguous positions, next_tokens consistent with y0."""

    kind = "oracle"

    def __init__(self, target: Transformer, corrupt: float = 0.3, seed: int = 0, k_max: int = 8) -> None:
        super().__init__(target)
        self.corrupt = corrupt
        self.g = torch.Generator().manual_seed(seed)
        self.k_max = k_max
        self.cache = None   # set to the decoder's target cache by the test
        self.seen: dict[int, int] = {}   # slot -> next expected context position

    @property
    def capture_layers(self):
        return (1, 0)

    def features(self, out: ForwardOut) -> Tensor:
        return torch.cat(out.captured, dim=-1)

    @property
    def max_draft(self) -> int:
        return self.k_max

    def reset(self, slot: int) -> None:
        self.seen.pop(slot, None)

    def propose(self, ctx: DraftContext, k: int, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        B = ctx.slots.shape[0]
        assert ctx.feats.shape[:2] == ctx.positions.shape == ctx.valid.shape == ctx.next_tokens.shape
        assert ctx.feats.shape[2] == 2 * self.target.config.hidden_size
        for b in range(B):
            s, m = int(ctx.slots[b]), int(ctx.valid[b].sum())
            assert m > 0 and bool(ctx.valid[b, :m].all()) and not bool(ctx.valid[b, m:].any())
            pos = ctx.positions[b]
            assert pos.tolist() == list(range(int(pos[0]), int(pos[0]) + pos.numel()))  # pads continue
            assert int(pos[0]) == self.seen.get(s, 0)
            assert int(pos[m - 1]) + 1 == int(ctx.start[b])
            assert int(ctx.next_tokens[b, m - 1]) == int(ctx.last_token[b])
            self.seen[s] = int(ctx.start[b])
        tokens = torch.empty(B, k, dtype=torch.long)
        cur, pos = ctx.last_token.clone(), ctx.start.clone()
        for i in range(k):
            out = self.target(cur[:, None], pos[:, None], self.cache, ctx.slots)
            cur = self.target.logits(out.hidden[:, -1]).argmax(-1)
            bad = torch.rand(B, generator=self.g) < self.corrupt
            cur = torch.where(bad, torch.randint(0, self.target.config.vocab_size, (B,), generator=self.g), cur)
            tokens[:, i] = cur
            pos = pos + 1
        return Proposal(tokens, torch.full((B, k), 0.5))


def oracle_decoder(target: Transformer, num_slots: int, max_len: int, corrupt: float = 0.3,
                   k_max: int = 8) -> SpecDecoder:
    drafter = OracleDrafter(target, corrupt, k_max=k_max)
    dec = SpecDecoder(target, drafter, num_slots, max_len)
    drafter.cache = dec.cache
    return dec


# --- single request ------------------------------------------------------------------------------

@pytest.mark.parametrize(("k", "corrupt"), [(1, 0.3), (3, 0.3), (7, 0.1), (5, 1.0), (4, 0.0)])
def test_spec_generate_is_token_identical_to_greedy(k, corrupt):
    target = make_target()
    for i, p in enumerate(prompts(4, seed=k)):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=40, max_len=128)
        dec = oracle_decoder(target, 1, 128, corrupt)
        got = spec_generate(target, None, CharTok(), p, GREEDY, max_tokens=40, k=k, decoder=dec)
        assert_lossless(target, p, got.token_ids, ref.token_ids, label=f"prompt {i}")
        assert got.finish_reason == ref.finish_reason and got.text == ref.text
        acc = got.stats.acceptance
        per_pos = acc.accepted_per_position
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False)), per_pos  # monotone
        assert acc.accepted == per_pos[0] + sum(per_pos[1:]) if per_pos else True
        if corrupt == 0.0:
            assert acc.mean_accepted_length > k   # perfect drafts: k+1 per step except the tail


def test_ar_engine_through_spec_decoder_matches_ar_generate():
    target = make_target()
    for p in prompts(3):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=30, max_len=128)
        got = spec_generate(target, None, CharTok(), p, GREEDY, max_tokens=30, max_len=128)
        assert got.token_ids == ref.token_ids
        assert got.stats.acceptance.mean_accepted_length == 1.0
        for s in (got.stats, ref.stats):
            assert isinstance(s.wall_s, float) and s.wall_s >= s.ttft_s > 0.0 and s.cached_prompt_tokens == 0


def test_max_tokens_reached_inside_an_accepted_block():
    target = make_target()
    p = prompts(1)[0]
    for m in (1, 2, 9, 10, 11):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=m, max_len=128)
        got = spec_generate(target, None, CharTok(), p, GREEDY, max_tokens=m, k=7,
                            decoder=oracle_decoder(target, 1, 128, corrupt=0.0))
        assert got.token_ids == ref.token_ids and len(got.token_ids) == m
        assert got.finish_reason == "length"


def test_eos_and_stop_string_inside_an_accepted_block():
    base = make_target()
    p = prompts(1, seed=5)[0]
    free = ar_generate(base, CharTok(), p, GREEDY, max_tokens=40, max_len=128).token_ids
    # EOS: make the 6th generated token the end-of-sequence id (first occurrence) -> cut mid-block
    eos = free[5]
    target = make_target(eos_token_id=eos)
    ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=40, max_len=128)
    got = spec_generate(target, None, CharTok(), p, GREEDY, max_tokens=40, k=7,
                        decoder=oracle_decoder(target, 1, 128, corrupt=0.0))
    assert got.token_ids == ref.token_ids and got.token_ids[-1] == eos
    assert got.finish_reason == "stop" and got.text == ref.text
    # stop string spanning two tokens in the middle of a block
    stop = CharTok.decode(free[8:10])
    ref = ar_generate(base, CharTok(), p, GREEDY, max_tokens=40, stop=(stop,), max_len=128)
    got = spec_generate(base, None, CharTok(), p, GREEDY, max_tokens=40, k=7, stop=(stop,),
                        decoder=oracle_decoder(base, 1, 128, corrupt=0.0))
    assert got.token_ids == ref.token_ids and got.text == ref.text and stop not in got.text
    assert got.finish_reason == "stop"


@pytest.mark.parametrize("room", [1, 2, 3, 6])
def test_prompt_near_the_context_limit_and_k_larger_than_the_room_left(room):
    target = make_target()
    max_len = 48
    p = prompts(1, seed=9, lo=max_len - room, hi=max_len - room + 1)[0]
    ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=100, max_len=max_len)
    got = spec_generate(target, None, CharTok(), p, GREEDY, max_tokens=100, k=8,
                        decoder=oracle_decoder(target, 1, max_len, corrupt=0.0))
    assert got.token_ids == ref.token_ids and len(got.token_ids) == room


def test_prompt_too_long_or_empty_is_refused():
    target = make_target()
    dec = oracle_decoder(target, 1, 32)
    with pytest.raises(PromptTooLong, match="context holds"):
        spec_generate(target, None, CharTok(), list(range(3, 35)), GREEDY, decoder=dec)
    with pytest.raises(EmptyPrompt, match="empty prompt"):
        spec_generate(target, None, CharTok(), [], GREEDY, decoder=dec)


def test_verify_clamps_keep_to_the_room_left():
    target = make_target()
    dec = oracle_decoder(target, 1, 24, corrupt=0.0)
    p = list(range(3, 22))   # 19 tokens, y0 at position 19: positions 19..23 fit -> keep <= 4
    dec.prefill(0, p, GREEDY)
    out = dec.verify([0], dec.draft([0], 8), [8])[0]
    assert dec.stats(0).drafted == 4 and len(out) == 5 and dec.length(0) == 24
    with pytest.raises(ContextFull, match="full"):
        dec.verify([0], None, [0])


def test_drafter_for_another_target_is_rejected():
    a, b = make_target(0), make_target(1)
    with pytest.raises(DrafterMismatch, match="different target"):
        SpecDecoder(a, OracleDrafter(b), 1, 32)


# --- batches -------------------------------------------------------------------------------------

def _run_batch(dec: SpecDecoder, ps: list[list[int]], max_tokens: int, k: int, keep_fn,
               batched_prefill: bool = False) -> list[list[int]]:
    outs: dict[int, list[int]] = {}
    if batched_prefill:
        outs = {s: [y] for s, y in enumerate(dec.prefill_batch(list(range(len(ps))), ps, [GREEDY] * len(ps)))}
    for s, p in enumerate(ps):
        if not batched_prefill:
            outs[s] = [dec.prefill(s, p, GREEDY)]
    live = list(range(len(ps)))
    while live:
        proposal = dec.draft(live, k)
        rows = dec.verify(live, proposal, [keep_fn(s) for s in live])
        for s, row in zip(live, rows, strict=True):
            outs[s] += row
        live = [s for s in live if len(outs[s]) < max_tokens]
    return [outs[s][:max_tokens] for s in range(len(ps))]


def test_backlog_groups_keep_catching_up_rows_apart():
    assert backlog_groups([4, 3, 4], 10) == [[0, 1, 2]]
    assert backlog_groups([4, 300, 2, 11], 10) == [[0, 2], [1, 3]]
    assert backlog_groups([300], 10) == [[0]] and backlog_groups([], 10) == []


@pytest.mark.parametrize("kind", ["oracle", "mtp", "dfly"])
def test_a_request_joining_a_running_batch_is_drafted_apart_and_stays_lossless(kind):
    """Two rows decode; a third arrives with a 60-token prompt. Its first drafting pass takes the whole
    prompt as new context: it gets a call of its own, and the steady rows' call is not padded to 60
    positions. Every row stays greedy decoding."""
    target = make_target()
    ps = prompts(2, seed=5, lo=5, hi=12) + [torch.randint(3, TINY.vocab_size, (60,),
                                                          generator=torch.Generator().manual_seed(9)).tolist()]
    if kind == "oracle":
        dec, k = oracle_decoder(target, 3, 160, corrupt=0.25), 4
    else:
        drafter = _real_drafter(kind, target, 8).eval()
        dec, k = SpecDecoder(target, drafter, 3, 160), min(4, drafter.max_draft)
    drafter = dec.drafter
    assert drafter is not None
    calls: list[tuple[list[int], int]] = []
    propose = drafter.propose

    def spy(ctx: DraftContext, *a, **kw) -> Proposal:
        calls.append((ctx.slots.tolist(), int(ctx.feats.shape[1])))
        return propose(ctx, *a, **kw)

    drafter.propose = spy  # type: ignore[method-assign]
    outs = {s: [dec.prefill(s, ps[s], GREEDY)] for s in (0, 1)}

    def step(live: list[int]) -> None:
        for s, row in zip(live, dec.verify(live, dec.draft(live, k), [k] * len(live)), strict=True):
            outs[s] += row

    for _ in range(3):
        step([0, 1])
    outs[2] = [dec.prefill(2, ps[2], GREEDY)]
    calls.clear()
    step([0, 1, 2])
    new_context = {tuple(slots): t for slots, t in calls}   # rows of a call -> positions it is padded to
    assert len(calls) == 2 and new_context[(2,)] == 60 and new_context[(0, 1)] <= k + 1   # a step's worth, not 60
    while min(len(o) for o in outs.values()) < 24:
        step([0, 1, 2])
    for s, p in enumerate(ps):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=24, max_len=160).token_ids
        assert_lossless(target, p, outs[s][:24], ref, label=f"{kind} row {s}")


@pytest.mark.parametrize(("random_keep", "batched_prefill"), [(False, False), (True, False), (True, True)])
def test_ragged_batch_equals_per_request_greedy(random_keep, batched_prefill):
    target = make_target()
    ps = prompts(5, seed=3, lo=2, hi=40)
    g = torch.Generator().manual_seed(0)
    keep_fn = (lambda s: int(torch.randint(0, 7, (1,), generator=g))) if random_keep else (lambda s: 6)
    dec = oracle_decoder(target, 6, 128, corrupt=0.25)
    got = _run_batch(dec, ps, 36, 6, keep_fn, batched_prefill)
    for i, p in enumerate(ps):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=36, max_len=128).token_ids
        assert_lossless(target, p, got[i], ref, label=f"row {i}")


def test_ar_decoder_batch_is_plain_decoding():
    target = make_target()
    ps = prompts(4, seed=4)
    dec = SpecDecoder(target, None, 4, 96)
    got = _run_batch(dec, ps, 20, 0, lambda s: 0)
    for p, g in zip(ps, got, strict=True):
        assert_lossless(target, p, g, ar_generate(target, CharTok(), p, GREEDY, max_tokens=20, max_len=96).token_ids)


def test_slot_reuse_after_release():
    target = make_target()
    dec = oracle_decoder(target, 2, 96)
    a, b = prompts(2, seed=8)
    spec_generate(target, None, CharTok(), a, GREEDY, max_tokens=20, k=4, decoder=dec, slot=1)
    got = spec_generate(target, None, CharTok(), b, GREEDY, max_tokens=20, k=4, decoder=dec, slot=1)
    assert got.token_ids == ar_generate(target, CharTok(), b, GREEDY, max_tokens=20, max_len=96).token_ids


def test_sampling_is_reproducible_with_a_seed_and_batched_like_single():
    target = make_target()
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=123)
    p = prompts(1, seed=6)[0]
    runs = [spec_generate(target, None, CharTok(), p, params, max_tokens=25, k=4,
                          decoder=oracle_decoder(target, 1, 96)).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_check_lossless_flags_real_differences():
    target = make_target()
    p = prompts(1)[0]
    ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=10, max_len=64).token_ids
    bad = ref[:4] + [(ref[4] + 1) % TINY.vocab_size] + ref[5:]
    res = check_lossless(target, p, bad, ref)
    assert not res.ok and res.position == 4 and "first difference" in res.reason
    assert not check_lossless(target, p, ref[:-1], ref).ok
    assert check_lossless(target, p, ref, ref).identical


# --- the real drafters (random weights): plumbing and losslessness --------------------------------

def _real_drafter(kind: str, target: Transformer, block: int):
    registry = pytest.importorskip("engines.drafters.registry")
    cfg = {} if registry.DRAFTERS[kind].autoregressive else {"block_size": block}
    return registry.new_drafter(kind, target, **cfg)


@pytest.mark.parametrize(("kind", "block"), [("mtp", 0), ("dflash", 8), ("dfly", 16)])
def test_random_real_drafters_are_lossless_single_and_batched(kind, block):
    target = make_target()
    drafter = _real_drafter(kind, target, block).eval()
    k = drafter.max_draft
    ps = prompts(3, seed=12, lo=2, hi=30)
    refs = [ar_generate(target, CharTok(), p, GREEDY, max_tokens=24, max_len=128) for p in ps[:2]]
    # a random drafter over the full vocabulary accepts nothing, which would leave verification's
    # accept path untested: its draft vocabulary is narrowed to the target's two commonest greedy tokens,
    # so its (still random) proposals are accepted some of the time and rejected the rest
    common = Counter(t for r in refs for t in r.token_ids).most_common(2)
    drafter.set_draft_vocab(torch.tensor([t for t, _ in common]))
    drafted = accepted = 0
    for p, ref in zip(ps[:2], refs, strict=True):
        got = spec_generate(target, drafter, CharTok(), p, GREEDY, max_tokens=24, k=k, max_len=128)
        assert_lossless(target, p, got.token_ids, ref.token_ids, label=kind)
        drafted += got.stats.acceptance.drafted
        accepted += got.stats.acceptance.accepted
    assert 0 < accepted < drafted, (kind, accepted, drafted)   # both outcomes of verification exercised
    dec = SpecDecoder(target, drafter, 3, 128)
    g = torch.Generator().manual_seed(1)
    got = _run_batch(dec, ps, 24, k, lambda s: int(torch.randint(0, k + 1, (1,), generator=g)))
    for p, row in zip(ps, got, strict=True):
        ref = ar_generate(target, CharTok(), p, GREEDY, max_tokens=24, max_len=128).token_ids
        assert_lossless(target, p, row, ref, label=f"{kind} batched")


@pytest.mark.parametrize("kind", ["mtp", "dflash"])
def test_sampled_drafts_carry_q_and_are_reproducible(kind):
    target = make_target()
    drafter = _real_drafter(kind, target, 8).eval()
    params = SamplingParams(temperature=0.9, top_p=0.9)
    p = prompts(1, seed=14)[0]
    outs = []
    for _ in range(2):
        torch.manual_seed(5)   # the unseeded row's generator (a seeded row drafts greedily: the Gumbel rule)
        dec = SpecDecoder(target, drafter, 1, 96, sample_drafts=True)
        dec.prefill(0, p, params)
        proposal = dec.draft([0], 3)
        assert proposal is not None and proposal.probs is not None           # q kept for the ratio test
        assert torch.allclose(proposal.probs.sum(-1), torch.ones(1, 3), atol=1e-4)
        outs.append(spec_generate(target, None, CharTok(), p, params, max_tokens=20, k=3,
                                  decoder=SpecDecoder(target, drafter, 1, 96, sample_drafts=True)).token_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 20
    # greedy rows never sample drafts, even with the option on
    dec = SpecDecoder(target, drafter, 1, 96, sample_drafts=True)
    dec.prefill(0, p, GREEDY)
    assert dec.draft([0], 3).probs is None
