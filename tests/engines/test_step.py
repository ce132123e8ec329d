"""One decode step (`engines.step`) over a scripted decoder: which rows draft, how deep each row is
verified, how many forwards run, and what the batcher gets to count."""

from __future__ import annotations

import numpy as np
import torch

from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable
from engines.drafters.base import Proposal
from engines.step import decode_step, rows_of, verify_groups


class ScriptedDecoder:
    """Drafts token 7 with confidence `conf` for every row; slot s accepts `accept[s]` drafts."""

    def __init__(self, accept: dict[int, int], conf: float = 0.5) -> None:
        self.accept, self.conf = accept, conf
        self.drafts: list[tuple[list[int], int]] = []
        self.verifies: list[tuple[list[int], bool, list[int]]] = []
        self.last_ingest = 0

    def draft(self, slots, k):
        self.drafts.append((list(slots), k))
        B = len(slots)
        return Proposal(torch.full((B, k), 7), torch.full((B, k), self.conf))

    def verify(self, slots, proposal, keep):
        self.verifies.append((list(slots), proposal is not None, list(keep)))
        return [[7] * min(kp, self.accept[s]) + [1] for s, kp in zip(slots, keep, strict=True)]


def test_plain_step_without_a_drafter_budget():
    dec = ScriptedDecoder({0: 3, 1: 3})
    res = decode_step(dec, [0, 1], [5, 5], 0, None, [False, False], [(0, 0), (0, 0)])
    assert dec.drafts == [] and dec.verifies == [([0, 1], False, [0, 0])]
    assert res.out == [[1], [1]] and res.kept_fraction is None and not res.verified_drafts and res.drafted == []


def test_drafted_step_keeps_every_draft_that_fits_the_remaining_tokens():
    dec = ScriptedDecoder({4: 1, 5: 3, 6: 0})
    res = decode_step(dec, [4, 5, 6], [10, 3, 1], 4, None, [False] * 3, [(0, 0)] * 3)
    assert dec.drafts == [([4, 5, 6], 4)]
    assert res.keep == [4, 2, 0]                        # row 6 may emit one more token only: no drafts
    assert res.out == [[7, 1], [7, 7, 1], [1]] and res.accepted == [1, 2, 0]
    assert res.kept_fraction == 6 / 12 and res.dcut_kept_fraction == 1.0 and res.extra_forwards == 0
    assert res.drafted == [0, 1] and res.verified_drafts and not res.probe


def test_last_token_of_every_row_is_a_plain_step():
    dec = ScriptedDecoder({0: 3})
    res = decode_step(dec, [0], [1], 8, None, [False], [(0, 0)])
    assert dec.drafts == [] and res.keep == [0] and res.kept_fraction is None


def test_dcut_probe_drafts_for_one_row_while_plain_steps_win():
    K = 4
    table = CostTable.linear(K, base_ms=1.0, per_token_ms=1.0, batch_sizes=(1, 8)).with_draft_ms((2.0, 400.0))
    ctl = DcutController(table, K, probe_first=1)
    sel, raw = ctl.select(np.full((8, K), 0.05), [False] * 8)
    ctl.observe(raw, sel.keep, [0] * 8, sel.kept_fraction, overhead_ms=400.0, verify_ms=sel.cost_ms, sel=sel)
    dec = ScriptedDecoder(dict.fromkeys(range(8), 0), conf=0.05)
    slots, remaining, records = list(range(8)), [20] * 8, [(10, 10)] * 8
    results = [decode_step(dec, slots, remaining, K, ctl, [False] * 8, records) for _ in range(10)]
    probes = [r for r in results if r.probe]
    assert probes and all(not r.probe and r.kept_fraction is None for r in results[:8])   # plain first
    p = probes[0]
    assert sum(1 for kp in p.keep if kp) == 1 and p.drafted == [p.keep.index(K)] and p.verified_drafts
    assert dec.drafts == [([p.drafted[0]], K)]              # one drafter pass, for the probed row only
    # a D-Cut-off row (forced) disables the plain-step decision: everyone drafts
    res = decode_step(dec, slots, remaining, K, ctl, [True] + [False] * 7, records)
    assert not res.probe and res.keep[0] == K


def test_verify_groups_run_one_forward_per_group():
    dec = ScriptedDecoder({0: 2, 1: 0, 2: 1})
    prop = dec.draft([0, 1, 2], 3)
    out = verify_groups(dec, [0, 1, 2], prop, [3, 3, 1], [[0, 2], [1]])
    assert out == [[7, 7, 1], [1], [7, 1]]
    assert dec.verifies == [([0, 2], True, [3, 1]), ([1], True, [3])]
    assert rows_of(None, [0]) is None and rows_of(prop, [2]).tokens.shape == (1, 3)


def test_plan_counts_the_drafts_dcut_cut_within_the_rows_limits():
    """`VerifyPlan.cut` (the worker's `specroute_dcut_cut_*` counters): the drafts the rows' limits
    allowed that D-Cut left unverified; none without D-Cut, and a limit is no cut."""
    from engines.step import plan_verify

    conf = torch.tensor([[0.9, 0.9, 0.9, 0.9], [0.05, 0.05, 0.05, 0.05]])
    prop = Proposal(torch.full((2, 4), 7), conf)
    plain = plan_verify(prop, [10, 3], None, [False, False])
    assert plain.keep == [4, 2] and plain.cut == 0
    steep = CostTable.linear(4, base_ms=0.1, per_token_ms=5.0, batch_sizes=(1, 2, 4))
    dcut = DcutController(steep, 4)
    plan = plan_verify(prop, [10, 3], dcut, [False, False])
    assert plan.cut == sum(plain.keep) - sum(plan.keep) and plan.cut > 0, plan.keep
