"""Several engine modes over one target (`SpecDecoder(..., modes=...)`, `specroute worker --engine
mtp,dfly,ar`): rows of different drafters, and rows that do not draft, share one decode step and stay
token-identical to plain greedy decoding; the step splits a ragged verify by the target's cost model;
a mode the decoder does not serve is refused."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
import torch
from torch import Tensor

from engines.drafters.base import Proposal
from engines.errors import DrafterMismatch, EngineError
from engines.forward_cost import LinearCost
from engines.generate import ar_generate
from engines.model import ForwardOut, Transformer
from engines.modes import PLAIN_STEP
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from engines.step import decode_step, width_groups
from tests.engines.test_spec import CharTok, OracleDrafter, make_target, prompts
from tests.lossless import assert_lossless


class LowLayerOracle(OracleDrafter):
    """An oracle that reads another set of target layers (layer 0 only, twice), so the decoder's
    capture is the union of its modes' layers and each drafter gets a view of its own."""

    @property
    def capture_layers(self):
        return (0,)

    def features(self, out: ForwardOut) -> Tensor:
        assert len(out.captured) == 1
        return torch.cat([out.captured[0], out.captured[0]], dim=-1)


def multi_decoder(target: Transformer, slots: int, max_len: int = 160) -> SpecDecoder:
    wide = OracleDrafter(target, corrupt=0.2, seed=1, k_max=8)
    narrow = LowLayerOracle(target, corrupt=0.3, seed=2, k_max=3)
    dec = SpecDecoder(target, None, slots, max_len, modes={"wide": wide, "narrow": narrow, "ar": None})
    wide.cache = narrow.cache = dec.cache
    return dec


@pytest.mark.parametrize("compute_bound", [0.0, 2.0, 1e6])
def test_rows_of_three_modes_in_one_batch_equal_greedy_decoding(compute_bound):
    """Nine requests, three per mode, decoded together through `decode_step` (one verify forward, or
    several when the cost model says padding a narrow row costs more than another forward)."""
    target = make_target()
    dec = multi_decoder(target, 9)
    dec.compute_bound_tokens = compute_bound
    assert dec.capture == (0, 1) and dec.max_draft == 8 and dec.default_mode == "wide"
    ps = prompts(9, seed=4)
    modes = ["wide", "narrow", "ar"] * 3
    n = 30
    outs = {s: [dec.prefill_batch([s], [p], [SamplingParams()], [m])[0]]
            for s, (p, m) in enumerate(zip(ps, modes, strict=True))}
    live = list(range(9))
    while live:
        res = decode_step(dec, live, [n - len(outs[s]) for s in live], 8, None, [False] * len(live),
                          [(0, 0)] * len(live))
        for s, kept, row in zip(live, res.keep, res.out, strict=True):
            assert kept <= {"wide": 8, "narrow": 3, "ar": 0}[modes[s]]
            outs[s] += row
        live = [s for s in live if len(outs[s]) < n]
    for s, p in enumerate(ps):
        ref = ar_generate(target, CharTok(), p, SamplingParams(), max_tokens=n, max_len=160)
        assert_lossless(target, p, outs[s][:n], ref.token_ids, label=f"{modes[s]} row {s}")
        st = dec.stats(s)
        assert (st.drafted == 0) == (modes[s] == "ar")
        dec.release(s)


def test_default_mode_and_an_unknown_mode():
    target = make_target()
    dec = multi_decoder(target, 2)
    dec.start(0, [5, 6, 7], SamplingParams())
    assert dec.slots[0].mode == "wide"
    dec.start(1, [5, 6, 7], SamplingParams(), "ar")
    assert dec.slots[1].drafter is None
    with pytest.raises(EngineError, match="mode 'dflash' is not served here"):
        dec.start(1, [5, 6, 7], SamplingParams(), "dflash")


def test_a_tree_drafter_does_not_share_a_decoder():
    target = make_target()
    tree = OracleDrafter(target)
    tree.supports_dcut = False   # the trait a tree drafter declares
    with pytest.raises(DrafterMismatch, match="tree drafter"):
        SpecDecoder(target, None, 1, 64, modes={"tree": tree, "ar": None})


def test_merge_pads_narrow_parts_and_rows_that_did_not_draft():
    wide = Proposal(torch.tensor([[1, 2, 3, 4]]), torch.full((1, 4), 0.5))
    narrow = Proposal(torch.tensor([[7, 8], [9, 9]]), torch.full((2, 2), 0.9))
    m = Proposal.merge([([2], wide), ([0, 3], narrow)], 4)   # row 1 drafted nothing
    assert m.tokens.tolist() == [[7, 8, 0, 0], [0, 0, 0, 0], [1, 2, 3, 4], [9, 9, 0, 0]]
    assert m.limits() == [2, 0, 4, 2]
    sub = m.rows([3, 2])
    assert sub.limits() == [2, 4] and sub.tokens[1].tolist() == [1, 2, 3, 4]
    assert Proposal.merge([([0], wide), ([1], wide)], 2).widths is None   # every row full width


def test_width_groups_split_only_when_padding_costs_more_than_a_forward():
    keep = [15, 3, 3, 3, 0]
    assert width_groups(keep, 15, 0.0) == [[0, 1, 2, 3, 4]]          # no cost model: one forward
    assert width_groups(keep, 15, 1e6) == [[0, 1, 2, 3, 4]]          # forwards dear: pad
    groups = width_groups(keep, 15, 2.0)                            # forwards cheap: split
    assert sorted(sorted(g) for g in groups)[0] == [0] and sum(len(g) for g in groups) == 5
    cost = LinearCost(10.0, 15)
    assert cost.cost_many([[2, 0]], [[1.0, 0.5]]).tolist() == [[10.0 + 2 * 16, 0.0]]


def test_rows_switching_drafters_step_by_step_stay_exact():
    """A wide-mode row drafted by the narrow mode's drafter in some steps, by its own in others and by
    none in plain steps (`draft(..., use=...)`): each drafter catches up on the context it missed (the
    oracles assert contiguous positions), and the output is plain greedy decoding's."""
    import random

    target = make_target()
    dec = multi_decoder(target, 4)
    ps = prompts(4, seed=7)
    modes = ["wide", "wide", "narrow", "ar"]
    wide, narrow = dec.modes["wide"], dec.modes["narrow"]
    wide.kind, narrow.kind = "wide", "narrow"   # what `steps_by` names them (a drafter class's kind)
    n, g = 40, random.Random(3)
    outs = {s: [dec.prefill_batch([s], [p], [SamplingParams()], [m])[0]] for s, (p, m) in enumerate(zip(ps, modes, strict=True))}
    live = list(range(4))
    served: dict[int, Counter[str]] = {s: Counter() for s in live}
    while live:
        use = [g.choice(("narrow", PLAIN_STEP, None)) if modes[s] == "wide" else
               g.choice((PLAIN_STEP, None)) if modes[s] == "narrow" else None for s in live]
        rows = dec.verify(live, dec.draft(live, 8, use), [8] * len(live))
        for s, u, row in zip(live, use, rows, strict=True):
            outs[s] += row
            served[s]["plain" if u == PLAIN_STEP or modes[s] == "ar" else u or modes[s]] += 1
        live = [s for s in live if len(outs[s]) < n]
    for s in range(4):   # each step is counted for the drafter that drafted it, or as plain
        assert dec.stats(s).steps_by == dict(served[s]), s
    for s, p in enumerate(ps):
        ref = ar_generate(target, CharTok(), p, SamplingParams(), max_tokens=n, max_len=160)
        assert_lossless(target, p, outs[s][:n], ref.token_ids, label=f"{modes[s]} row {s}")
    assert set(dec.slots[0].records) == {id(wide), id(narrow)}     # both drafted for it, each counted
    with pytest.raises(EngineError, match="cannot draft"):
        dec.draft([3], 8, ["wide"])                                  # a plain row never drafts


def test_choose_narrows_wide_rows_where_the_step_gains():
    from engines.modes import Option, choose

    wide = [Option(1, 15, 5.0), Option(2, 3, 3.2)]
    narrow = [Option(2, 3, 3.2)]
    plain = [Option(-1, 0, 1.0)]
    draft_ms, unit, bound = {1: 9.0, 2: 5.0}, 12.0, 27.0
    assert choose([wide], draft_ms, unit, bound) == [0]           # alone, a verify is cheap: its own mode
    assert choose([wide, narrow, narrow, narrow], draft_ms, unit, bound) == [1, 0, 0, 0]   # busy: dear
    assert choose([wide, wide, plain], draft_ms, unit, bound) == [1, 1, 0]
    # a wide drafter that pays for itself stays, even in a batch
    assert choose([[Option(1, 15, 12.0), Option(2, 3, 3.2)], narrow], draft_ms, unit, bound) == [0, 0]
    # a busy batch whose drafts hardly get accepted (T=1) takes a plain step; one that accepts, drafts
    hot = [[Option(2, 3, 1.3), Option(-1, 0, 1.0)]] * 4
    assert choose(hot, draft_ms, unit, bound) == [1, 1, 1, 1]
    assert choose([[Option(2, 3, 3.2), Option(-1, 0, 1.0)]] * 4, draft_ms, unit, bound) == [0, 0, 0, 0]
    # alone too: a drafter that does not pay at one row is left out (a lone wide row whose drafts are
    # accepted no better than the narrow drafter's drafts narrow)
    assert choose(hot[:1], draft_ms, unit, bound) == [1]
    assert choose([[Option(1, 15, 3.3), Option(2, 3, 3.2)]], draft_ms, unit, bound) == [1]


def test_the_step_is_priced_as_the_decoder_verifies_it():
    """Verify forwards are padded to their widest row, cut by width where that is cheaper: a row going
    plain beside rows that draft saves nothing there, and a DFly row beside MTP rows costs a forward."""
    from engines.dcut.selection import plan_groups
    from engines.modes import Option, choose, verify_cost

    rng = random.Random(0)
    for _ in range(200):
        widths = [rng.choice((0, 3, 7, 15)) for _ in range(rng.randint(1, 12))]
        _, cost = plan_groups(widths, 15, LinearCost(27.0, 15))
        assert verify_cost(widths, 27.0) == pytest.approx(cost), widths
    assert verify_cost([3, 3, 3, 3], 27.0) == 27.0 + 16 == verify_cost([3, 3, 3, 0], 27.0)
    # rows at T=1 whose drafts are hardly accepted: alone, or with the whole batch, they go plain; beside
    # rows that accept they keep drafting, since plain would not make the forward cheaper
    draft_ms, unit, bound = {2: 5.0}, 12.0, 27.0
    hot, cold = [Option(2, 3, 1.3), Option(-1, 0, 1.0)], [Option(2, 3, 3.2), Option(-1, 0, 1.0)]
    assert choose([hot] * 4, draft_ms, unit, bound) == [1] * 4
    assert choose([hot, hot, cold, cold], draft_ms, unit, bound) == [0] * 4
    # what a step costs beyond its forwards (emitting, streaming) is paid per step: with enough of it,
    # even those hot rows get more tokens per ms drafting
    assert choose([hot] * 4, draft_ms, unit, bound, overhead_ms=20.0) == [0] * 4
    # a drafter not measured yet is priced as the dearest one measured: counted free, it keeps these
    # seven wide rows wide, where drafting them with the measured narrow drafter does better
    wide, cold = [Option(1, 15, 7.0), Option(2, 3, 3.0), Option(-1, 0, 1.0)], [Option(2, 3, 3.0), Option(-1, 0, 1.0)]
    assert choose([wide] * 7 + [cold], {2: 7.5}, 8.5, 21.4) == [1] * 7 + [0]
    assert choose([wide] * 7 + [cold], {1: 0.0, 2: 7.5}, 8.5, 21.4) == [0] * 8


def test_a_drafter_behind_on_a_row_is_priced_with_its_catch_up():
    """A wide row that drafted narrow for a while has left its own drafter behind: going back costs a
    pass over that context, spread over the steps the row has left; near its end it stays narrow."""
    from engines.modes import Option, choose

    draft_ms, catchup, unit, bound = {1: 8.0, 2: 7.0}, {1: 0.07, 2: 0.05}, 7.0, 22.0

    def row(backlog: int, left: int) -> list[Option]:
        return [Option(1, 15, 5.0, backlog, left / 5.0), Option(2, 3, 3.0, 0, left / 3.0), Option(-1, 0, 1.0)]

    assert choose([row(0, 60)], draft_ms, unit, bound, catchup) == [0]        # steady: its own drafter pays
    assert choose([row(300, 60)], draft_ms, unit, bound, catchup) == [0]      # behind, with a long way to go
    assert choose([row(300, 10)], draft_ms, unit, bound, catchup) == [1]      # behind, nearly done
    assert choose([row(300, 10)], draft_ms, unit, bound) == [0]               # catch-ups unpriced


def test_a_modes_rows_are_judged_on_what_the_drafter_does_for_that_mode():
    """The router sends each mode its own traffic: MTP's figure on chat rows says little about what it
    would emit for code rows in the DFly mode. A row's prior is the drafter's mean on rows of its mode
    once MODE_MIN of them are seen, the drafter's overall mean before; forgetting a drafter drops both."""
    from engines.modes import MODE_MIN, ModeCosts

    d = torch.nn.Linear(1, 1)
    d.max_draft = 3   # type: ignore[attr-defined]
    c = ModeCosts()
    for _ in range(20):
        c.observe_row(d, 2, ("mtp",))                 # chat rows: 2 tokens a step
    for _ in range(MODE_MIN):
        assert c.expected(None, d, ("dfly",)) == pytest.approx(c.mean_tokens[id(d)])   # the overall mean
        c.observe_row(d, 4, ("dfly",))                # code rows: 4
    assert c.seen_in(d, "dfly") == MODE_MIN and c.expected(None, d, ("dfly",)) == pytest.approx(4.0)
    assert c.expected(None, d, ("mtp",)) == pytest.approx(2.0) and c.expected((4, 12), d, ("dfly",)) == pytest.approx(3.5)
    c.forget(d)
    assert c.seen_in(d, "dfly") == 0 and c.expected(None, d, ("dfly",)) == pytest.approx(1.9)   # the width's prior


def test_a_rows_prior_is_the_mean_of_its_most_specific_class_seen_enough():
    """A row is judged by its class, most specific first (`SlotState.classes`): its mode with its domain
    and temperature bucket, its mode with its bucket, its mode. Chat rows in the DFly mode after code
    rows there, or hot rows after greedy ones, read their own class's mean once MODE_MIN are seen."""
    from engines.modes import MODE_MIN, ModeCosts
    from engines.sampling import SamplingParams
    from engines.slots import SlotState

    def classes(domain: str, temperature: float) -> tuple[str, ...]:
        return SlotState([1], SamplingParams(temperature=temperature), torch.Generator(), mode="dfly",
                         domain=domain).classes

    assert classes("code", 0.0) == ("dfly|d=code|t=0", "dfly|t=0", "dfly")
    assert classes("", 1.0) == ("dfly|t=high", "dfly")
    d = torch.nn.Linear(1, 1)
    d.max_draft = 15   # type: ignore[attr-defined]
    c = ModeCosts()
    for _ in range(MODE_MIN):
        c.observe_row(d, 6, classes("code", 0.0))      # code rows: 6 tokens a step
    for _ in range(MODE_MIN):
        assert c.expected(None, d, classes("chat", 0.0)) == pytest.approx(c.mode_tokens[(id(d), "dfly|t=0")])
        c.observe_row(d, 2, classes("chat", 0.0))      # chat rows after the drift: 2
    assert c.expected(None, d, classes("chat", 0.0)) == pytest.approx(2.0)
    assert c.expected(None, d, classes("code", 0.0)) == pytest.approx(6.0)
    assert c.expected(None, d, classes("chat", 1.0)) == pytest.approx(4.0)   # no hot row yet: the mode's mean
    for _ in range(MODE_MIN):
        c.observe_row(d, 1, classes("chat", 1.0))
    assert c.expected(None, d, classes("", 1.0)) == pytest.approx(1.0)      # an unlabelled hot row
    assert c.expected((4, 8), d, classes("chat", 1.0)) == pytest.approx(1.5)   # the row's record, shrunk


def test_wide_rows_try_the_narrow_drafter_until_their_mode_has_a_figure_for_it():
    """Rows of a wide mode keeping their own drafter draft with the narrow one every MODE_PROBE_EVERY-th
    step until MODE_MIN of their mode's row-steps are seen with it; then the cost model alone decides."""
    from engines.modes import MODE_MIN, MODE_PROBE_EVERY, step_drafters

    target = make_target()
    dec = multi_decoder(target, 2)
    wide, narrow = dec.modes["wide"], dec.modes["narrow"]
    dec.compute_bound_tokens, dec.costs.unit_ms = 27.0, 12.0
    dec.costs.draft_ms.update({id(wide): 9.0, id(narrow): 5.0})
    dec.costs.mean_tokens.update({id(wide): 12.0, id(narrow): 3.2})   # the wide drafter pays by far
    slots = [0, 1]
    dec.prefill_batch(slots, prompts(2, seed=5), [SamplingParams()] * 2, ["wide"] * 2)
    uses = [step_drafters(dec, slots) for _ in range(2 * MODE_PROBE_EVERY)]
    probes = [i for i, u in enumerate(uses) if u == ["narrow"] * 2]
    assert probes == [MODE_PROBE_EVERY - 1, 2 * MODE_PROBE_EVERY - 1]
    assert all(u is None for i, u in enumerate(uses) if i not in probes)   # otherwise their own
    for _ in range(MODE_MIN):
        dec.costs.observe_row(narrow, 3, ("wide",))
    assert all(step_drafters(dec, slots) is None for _ in range(2 * MODE_PROBE_EVERY))


def test_mode_costs_ignore_a_drafters_cold_first_pass():
    from engines.modes import ModeCosts

    d = torch.nn.Linear(1, 1)
    d.max_draft = 15   # type: ignore[attr-defined]
    c = ModeCosts()
    c.observe_pass(d, 60.0, 300, 15)    # builds its tables: not its cost
    c.observe_pass(d, 40.0, 300, 15)    # a catch-up before any steady pass: nothing to measure it against
    assert c.catchup_ms == {}
    c.observe_pass(d, 9.0, 16, 15)
    assert c.draft_ms[id(d)] == 9.0
    c.observe_pass(d, 39.0, 300, 15)    # a catch-up: what it took beyond a pass, per position
    assert c.catchup_ms[id(d)] == pytest.approx(0.1) and c.draft_ms[id(d)] == 9.0
    c.observe_verify(20.0, 16, 27.0)
    assert c.unit_ms == pytest.approx(20.0 * 28 / 43)
    assert c.expected(None, d) == pytest.approx(1 + 0.3 * 15)   # nothing seen: the width's prior
    c.observe_row(d, 8)
    assert c.expected((4, 8), d) == pytest.approx((8 + 4 * 8) / 8)
    c.observe_row(d, 2)                 # a plain average while few are seen: one outlier does not stick
    assert c.mean_tokens[id(d)] == pytest.approx(5.0)


def test_a_worker_with_one_drafting_mode_may_still_take_plain_steps():
    from engines.modes import step_drafters

    target = make_target()
    oracle = OracleDrafter(target, k_max=3)
    dec = SpecDecoder(target, None, 4, 64, modes={"narrow": oracle, "ar": None})
    dec.compute_bound_tokens, dec.costs.unit_ms = 27.0, 12.0
    dec.costs.draft_ms[id(oracle)] = 5.0
    dec.costs.mean_tokens[id(oracle)] = 1.2      # hardly anything accepted (T=1 under load)
    for s in range(4):
        dec.start(s, [5, 6, 7], SamplingParams(), "narrow")
    assert step_drafters(dec, [0, 1, 2, 3]) == [PLAIN_STEP] * 4
    dec.costs.mean_tokens[id(oracle)] = 3.2      # drafts pay: no override
    assert step_drafters(dec, [0, 1, 2, 3]) is None


def test_a_narrow_drafter_left_out_is_probed_before_rows_stay_plain_for_good():
    """A pessimistic first figure for the narrow drafter sends a batch of wide rows plain; after
    PROBE_EVERY steps without it those rows draft with it once, its estimate is revised from what it
    then emits (a good drafter here: the rows go on drafting with it), and it never sits out longer."""
    from engines.modes import PROBE_EVERY, step_drafters

    target = make_target()
    dec = multi_decoder(target, 4)
    wide, narrow = dec.modes["wide"], dec.modes["narrow"]
    dec.compute_bound_tokens, dec.costs.unit_ms = 27.0, 12.0
    dec.costs.draft_ms.update({id(wide): 9.0, id(narrow): 5.0})
    dec.costs.mean_tokens.update({id(wide): 2.0, id(narrow): 1.1})   # both look useless: plain wins
    slots = [0, 1, 2, 3]
    dec.prefill_batch(slots, prompts(4, seed=5), [SamplingParams()] * 4, ["wide"] * 4)
    probes = []
    for i in range(3 * PROBE_EVERY):
        use = step_drafters(dec, slots)
        if use == ["narrow"] * 4:
            probes.append(i)
            dec.verify(slots, dec.draft(slots, 8, use), [8] * 4)   # drafting with it marks it used
            assert dec.costs.idle(narrow) == 0
        else:
            assert use == [PLAIN_STEP] * 4
    assert probes[:2] == [PROBE_EVERY - 1, PROBE_EVERY]        # the probe, then a choice on the revised figure
    assert dec.costs.mean_tokens[id(narrow)] > 1.5
    assert all(b - a <= PROBE_EVERY for a, b in zip(probes, [*probes[1:], 3 * PROBE_EVERY], strict=True))


def test_a_batcher_measures_what_its_steps_cost_beyond_their_forwards():
    """The batcher times each decode step (no prefill in it) to the next and hands the multi-mode cost
    model what its drafter and target calls did not take; and each request's domain, which its rows'
    acceptance is judged by."""
    from engines.batcher import Batcher
    from engines.requests import BatcherConfig, GenRequest

    target = make_target()
    dec = multi_decoder(target, 2)
    b = Batcher(dec, CharTok.decode, [], BatcherConfig(max_running=2, max_waiting=4, max_len=160)).start()
    done = [threading.Event() for _ in range(2)]
    for i, p in enumerate(prompts(2, seed=9)):
        b.submit(GenRequest(p, max_tokens=24, mode="wide", domain="code"),
                 lambda ev, e=done[i]: e.set() if ev.finish_reason else None)
    assert all(e.wait(30) for e in done)
    b.stop()
    assert dec.costs.step_overhead_ms > 0.0
    assert {c for _, c in dec.costs.mode_seen} >= {"wide|d=code|t=0", "wide|t=0", "wide"}
