"""DcutController: observation, the live switch, and plain steps with probes where drafting loses."""

from __future__ import annotations

import numpy as np

from engines.dcut.controller import DcutController
from engines.dcut.cost import CostTable


def test_controller_observe_and_switch():
    ctl = DcutController(CostTable.linear(4), 4)
    sel, raw = ctl.select(np.full((2, 4), 0.5), [False, False])
    ctl.observe(raw, sel.keep, [0, 1], sel.kept_fraction, overhead_ms=2.0)
    assert ctl.overhead_ms == 2.0
    ctl.set_enabled(False)
    assert not ctl.enabled


def _spec_step(ctl: DcutController, conf: np.ndarray, accepted: list[int], draft_ms: float) -> None:
    sel, raw = ctl.select(conf, [False] * conf.shape[0])
    ctl.observe(raw, sel.keep, accepted, sel.kept_fraction, overhead_ms=draft_ms, verify_ms=sel.cost_ms, sel=sel)


def test_plain_steps_where_drafting_does_not_pay_with_doubling_probes():
    K = 4
    # compute-bound verify (every token costs) and an expensive drafter: drafting loses at batch 8
    table = CostTable.linear(K, base_ms=1.0, per_token_ms=1.0, batch_sizes=(1, 8)).with_draft_ms((2.0, 40.0))
    ctl = DcutController(table, K, probe_first=4)
    _spec_step(ctl, np.full((8, K), 0.05), [0] * 8, 40.0)      # hopeless drafts observed
    assert not ctl.pays(8)
    decisions = [ctl.rows_to_draft([(10, 10)] * 8) for _ in range(32 + 64 + 2)]
    probes = [i for i, d in enumerate(decisions) if d]
    assert probes == [32, 32 + 64 + 1]                 # a probe after 4 x 8 = 32, then 64 plain steps
    assert [len(decisions[i]) for i in probes] == [1, 1]         # ... drafting for one row only
    assert decisions[probes[0]] != decisions[probes[1]]          # rotating
    # a newly admitted row (not measured yet) is probed first, and soon
    new = [(10, 10)] * 7 + [(0, 0)]
    after = [ctl.rows_to_draft(new) for _ in range(40)]
    assert after.index([7]) == 32
    assert ctl.skipped_steps == len(decisions) - 2 + 39


def test_drafting_continues_where_it_pays_and_the_switch_turns_it_on():
    K = 4
    table = CostTable.linear(K, base_ms=10.0, per_token_ms=0.1, batch_sizes=(1, 8)).with_draft_ms((1.0, 2.0))
    ctl = DcutController(table, K)
    _spec_step(ctl, np.full((1, K), 0.9), [K], 1.0)              # confident drafts, all accepted
    assert ctl.pays(1) and all(ctl.rows_to_draft([(0, 0)]) == [0] for _ in range(200))
    # a drafter that keeps getting slower (e.g. a long context) turns drafting off at this batch size
    for _ in range(40):
        _spec_step(ctl, np.full((8, K), 0.9), [0] * 8, 200.0)
    assert not ctl.pays(8) and ctl.rows_to_draft([(0, 0)] * 8) == []
    ctl.set_enabled(False)
    assert ctl.rows_to_draft([(0, 0)] * 8) == list(range(8))


def test_rows_that_draft_well_keep_drafting_in_a_batch_that_otherwise_would_not():
    K = 4
    table = CostTable.linear(K, base_ms=5.0, per_token_ms=0.5, batch_sizes=(1, 8)).with_draft_ms((3.0, 6.0))
    ctl = DcutController(table, K)
    _spec_step(ctl, np.full((2, K), 0.3), [0, 0], 3.0)           # the average row accepts nothing
    assert ctl.rows_to_draft([(0, 0), (0, 0)]) == []
    assert ctl.rows_to_draft([(20, 96), (20, 100)]) == [0, 1]   # these two accept almost everything
    # one unlucky step does not switch a good row off: its record is shrunk towards the average
    assert ctl.rows_to_draft([(21, 97), (21, 101)]) == [0, 1]


def test_new_rows_start_from_their_temperature_buckets_acceptance():
    """Greedy rows accept everything, T=1 rows nothing: a new T=1 row's prior is the T=1 rows' average
    (no drafting at batch 2), a new greedy row's the greedy rows' (drafting), not one fleet average."""
    K = 4
    table = CostTable.linear(K, base_ms=5.0, per_token_ms=0.5, batch_sizes=(1, 8)).with_draft_ms((3.0, 6.0))
    ctl = DcutController(table, K)
    for _ in range(10):
        sel, raw = ctl.select(np.full((2, K), 0.5), [False, False])
        ctl.observe(raw, sel.keep, [K, 0], sel.kept_fraction, buckets=["0", "high"])
    assert ctl.tokens_by_bucket["0"] > 4.5 and ctl.tokens_by_bucket["high"] == 1.0
    assert ctl.row_prior("0") > ctl.row_prior(None) > ctl.row_prior("high") == 1.0
    assert ctl.rows_to_draft([(0, 0), (0, 0)], ["0", "0"]) == [0, 1]
    assert ctl.rows_to_draft([(0, 0), (0, 0)], ["high", "high"]) == []
    assert ctl.row_prior("low") == ctl.row_prior(None)   # no observation yet: the fleet average
