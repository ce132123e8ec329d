"""D-Cut selection, cost model and calibration: pure functions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.dcut import (
    RATIOS,
    Calibration,
    CostTable,
    DcutController,
    calibrate,
    load_or_profile,
    machine_key,
    plan_groups,
    prefix_scores,
    select_keep,
)

confs = st.integers(1, 12).flatmap(
    lambda b: st.integers(1, 8).flatmap(
        lambda k: st.lists(st.lists(st.floats(0.0, 1.0), min_size=k, max_size=k), min_size=b, max_size=b)))


def test_prefix_scores_are_prefix_products_and_monotone():
    s = prefix_scores(np.array([[0.5, 0.5, 1.0], [1.0, 0.2, 0.9]]))
    np.testing.assert_allclose(s, [[0.5, 0.25, 0.25], [1.0, 0.2, 0.18]])
    f = prefix_scores(np.array([[0.5, 0.5]]), np.array([1.0, 3.0]))  # calibrated up, clipped to stay monotone
    np.testing.assert_allclose(f, [[0.5, 0.5]])


def test_ratio_one_only_equals_no_pruning():
    conf = np.random.default_rng(0).random((5, 7))
    sel = select_keep(prefix_scores(conf), CostTable.linear(7), ratios=(1.0,))
    assert sel.keep == [7] * 5 and sel.kept_fraction == 1.0 and sel.cost_ms == sel.full_cost_ms


@given(confs)
@settings(max_examples=200, deadline=None)
def test_selection_is_prefix_consistent_and_never_costlier(conf):
    c = np.asarray(conf)
    B, K = c.shape
    table = CostTable.linear(K, base_ms=0.5, per_token_ms=0.3)
    s = prefix_scores(c)
    sel = select_keep(s, table)
    assert len(sel.keep) == B and all(0 <= k <= K for k in sel.keep)
    assert sel.ratio in RATIOS
    assert sel.cost_ms <= sel.full_cost_ms + 1e-9
    kept = {(i, j) for i in range(B) for j in range(sel.keep[i])}
    # kept set is a global top-K: every kept score >= every dropped score
    dropped = [s[i, j] for i in range(B) for j in range(K) if (i, j) not in kept]
    if kept and dropped:
        assert min(s[i, j] for i, j in kept) >= max(dropped) - 1e-12
    assert sum(sel.keep) == pytest.approx(sel.kept_fraction * B * K)
    assert sorted(i for g in sel.groups for i in g) == list(range(B))     # groups partition the rows


def test_confident_drafts_are_kept_and_hopeless_ones_cut():
    K = 8
    table = CostTable.linear(K, base_ms=10.0, per_token_ms=0.5)
    hi = np.full((4, K), 0.99)
    assert select_keep(prefix_scores(hi), table).keep == [K] * 4
    lo = np.full((4, K), 0.05)
    sel = select_keep(prefix_scores(lo), table)
    assert sel.ratio == 0.25 and sum(sel.keep) == 8


def test_flat_cost_keeps_everything():
    K = 8
    flat = CostTable((1, 32), (0.0, 1.0), ((5.0, 5.0), (5.0, 5.0)), K)   # memory bound: tokens free
    sel = select_keep(prefix_scores(np.full((4, K), 0.1)), flat)
    assert sel.keep == [K] * 4


def test_forced_rows_keep_all_drafts():
    K = 6
    sel = select_keep(prefix_scores(np.full((3, K), 0.05)), CostTable.linear(K, 1.0, 1.0),
                      forced=[False, True, False])
    assert sel.keep[1] == K and sel.keep[0] + sel.keep[2] < 2 * K


def test_cost_table_interpolates_and_extrapolates():
    t = CostTable((1, 4), (0.0, 1.0), ((1.0, 3.0), (4.0, 10.0)), 4)
    assert t.cost(1, 0.5) == pytest.approx(2.0)
    assert t.cost(4, 1.0) == 10.0 and t.cost(8, 1.0) == pytest.approx(20.0)
    noisy = CostTable((1, 2), (0.0, 1.0), ((2.0, 1.0), (1.0, 1.0)), 4).monotone()
    assert noisy.ms == ((2.0, 2.0), (2.0, 2.0))
    assert CostTable.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_calibration_learns_overconfident_drafts():
    cal = Calibration.empty(3)
    raw = prefix_scores(np.full((4, 3), 0.9))
    for _ in range(300):   # drafts claim 0.9 but only the first position is ever accepted
        cal = calibrate(cal, raw, [3, 3, 3, 3], [1, 1, 1, 1])
    f = cal.factors()
    assert f[0] == pytest.approx(1 / 0.9, rel=0.05) and f[1] < 0.1 and f[2] < 0.1
    # unobserved positions (never verified) stay neutral
    cal2 = calibrate(Calibration.empty(3), raw, [1, 1, 1, 1], [1, 1, 1, 1])
    assert cal2.factors()[2] == 1.0


def test_controller_observe_and_switch():
    ctl = DcutController(CostTable.linear(4), 4)
    sel, raw = ctl.select(np.full((2, 4), 0.5), [False, False])
    ctl.observe(raw, sel.keep, [0, 1], sel.kept_fraction, overhead_ms=2.0)
    assert ctl.overhead_ms == 2.0
    ctl.set_enabled(False)
    assert not ctl.enabled


def _tiny_target(layers: int):
    import torch

    from engines.model import ModelConfig, Transformer, init_weights

    torch.manual_seed(0)
    target = Transformer(ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    init_weights(target)
    return target


def test_profile_is_cached_by_machine_key(tmp_path):
    target = _tiny_target(1)
    t1 = load_or_profile(target, tmp_path, 3, 1, batch_sizes=(1, 2), context=8, reps=1)
    doc = json.loads((tmp_path / "dcut_profile.json").read_text())
    assert machine_key(1, 3) in doc
    t2 = load_or_profile(target, tmp_path, 3, 1, batch_sizes=(1, 2), context=8, reps=1)
    assert t1 == t2
    assert t1.cost(2, 1.0) >= t1.cost(2, 0.0)


def test_plan_groups_splits_only_when_padding_costs_more_than_a_forward():
    K = 15
    keep = [15, 15, 1, 1, 1, 1, 1, 1]
    compute_bound = CostTable.linear(K, base_ms=0.1, per_token_ms=1.0)
    groups, cost = plan_groups(keep, K, compute_bound)
    assert sorted(map(sorted, groups)) == [[0, 1], [2, 3, 4, 5, 6, 7]]
    assert cost < compute_bound.cost(8, 1.0)
    overhead_bound = CostTable.linear(K, base_ms=100.0, per_token_ms=0.01)
    groups, cost = plan_groups(keep, K, overhead_bound)
    assert groups == [[0, 1, 2, 3, 4, 5, 6, 7]] and cost == pytest.approx(overhead_bound.cost(8, 1.0))
    assert plan_groups([3, 3], K, compute_bound, max_groups=1)[0] == [[0, 1]]


def test_cost_many_matches_scalar_cost():
    t = CostTable((1, 4, 16), (0.0, 0.5, 1.0), ((1, 2, 3), (2, 5, 9), (5, 15, 30)), 8)
    bs = np.array([0, 1, 2, 4, 10, 16, 32])
    fr = np.array([0.3, 0.0, 0.25, 1.0, 0.75, 0.5, 1.0])
    many = t.cost_many(bs, fr)
    assert many[0] == 0.0
    assert many[1] == pytest.approx(1.0) and many[2] == pytest.approx(1.5 + 2 / 3) and many[3] == pytest.approx(9.0) and many[6] == pytest.approx(60.0)
    assert [t.cost(int(b), float(f)) for b, f in zip(bs[1:], fr[1:], strict=True)] == pytest.approx(many[1:])


def test_drafting_pays():
    from engines.dcut import drafting_pays

    assert drafting_pays(expected=12.0, verify_ms=10.0, draft_ms=2.0, bs=4, ar_ms=5.0)       # 1.0 vs 0.8 tok/ms
    assert not drafting_pays(expected=5.0, verify_ms=10.0, draft_ms=2.0, bs=4, ar_ms=5.0)    # 0.42 vs 0.8


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


def test_profile_records_drafting_cost_per_batch_size(tmp_path):
    from engines.dcut import profile_draft_cost
    from engines.drafters.registry import new_drafter
    from engines.spec import SpecDecoder

    target = _tiny_target(4)
    dec = SpecDecoder(target, new_drafter("dfly", target, block_size=4), 2, 48)
    ms = profile_draft_cost(dec, 3, (1, 2), context=8, reps=1)
    assert len(ms) == 2 and all(m > 0 for m in ms)
    assert not dec.slots                                         # slots released for serving
    table = load_or_profile(target, tmp_path, 3, 1, decoder=dec, batch_sizes=(1, 2), context=8, reps=1)
    assert len(table.draft_ms) == 2
    doc = json.loads((tmp_path / "dcut_profile.json").read_text())
    assert machine_key(1, 3, "dfly") in doc and "draft_ms" in doc[machine_key(1, 3, "dfly")]
    assert load_or_profile(target, tmp_path, 3, 1, decoder=dec, batch_sizes=(1, 2), context=8, reps=1) == table
