"""D-Cut's decision math (scores, global top-K selection, grouping, calibration): pure functions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.dcut.cost import PROFILE_RATIOS, CostTable
from engines.dcut.selection import (
    RATIOS,
    Calibration,
    bs_bucket,
    calibrate,
    drafting_pays,
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


def test_drafting_pays():
    assert drafting_pays(expected=12.0, verify_ms=10.0, draft_ms=2.0, bs=4, ar_ms=5.0)       # 1.0 vs 0.8 tok/ms
    assert not drafting_pays(expected=5.0, verify_ms=10.0, draft_ms=2.0, bs=4, ar_ms=5.0)    # 0.42 vs 0.8


def test_bs_bucket_is_the_next_power_of_two():
    assert [bs_bucket(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 33)] == [1, 1, 2, 4, 4, 8, 8, 16, 64]


def test_a_timing_spike_in_the_profile_does_not_cut_a_block_at_batch_1():
    """Issue #16, a served math request at batch 1: a draft the target accepts 11 tokens of (the scores
    are its calibrated prefix products) was cut to 8 because the profile's spike at ratio 0.75 (116 ms,
    against 76 at 0.5 and 89 at 1.0) had been carried into full verification. Repaired by the suffix
    minimum, verifying all 15 is the better step and the 11 tokens are kept. Sixteen such rows at once
    (batch 16 costs as profiled under load: compute bound) are still cut to a quarter."""
    conf = np.array([[0.82, 0.76, 1.0, 0.45, 0.96, 0.95, 0.91, 1.0, 0.75, 0.99, 0.77, 0.32, 0.89, 0.71, 0.94]])
    ms = np.array([[61.0, 67.0, 76.0, 116.0, 89.0], [81.0, 102.0, 117.0, 135.0, 159.0],
                   [187.7, 274.7, 424.1, 559.4, 686.7]])
    old = CostTable((1, 2, 16), PROFILE_RATIOS, tuple(map(tuple, np.maximum.accumulate(ms, axis=1))), 15)
    new = CostTable((1, 2, 16), PROFILE_RATIOS, tuple(map(tuple, ms)), 15).monotone()
    s = prefix_scores(conf)
    assert select_keep(s, old, overhead_ms=38.0).keep == [8]
    assert select_keep(s, new, overhead_ms=38.0).keep == [15]
    under_load = select_keep(prefix_scores(np.repeat(conf, 16, axis=0)), new, overhead_ms=4 * 38.0)
    assert under_load.kept_fraction <= 0.25 and under_load.cost_ms < 0.5 * under_load.full_cost_ms


def test_a_cut_must_beat_full_verification_by_the_margin():
    """Issue #16: with a profile measured under load (batch 1: 48 ms for y0 alone, 99 for 15 drafts),
    these two served math drafts, which the target accepts 11 and 12 tokens of, were cut to 4 and 8:
    the cut looked a few percent better, and such steps are where the prefix products most
    underestimate a burst. A 10% margin verifies them in full; sixteen of them at once (a margin of
    10% / sqrt(16), the rows' errors averaging out) are still cut as far, to under two thirds of the
    full verify time."""
    table = CostTable((1, 8, 16), PROFILE_RATIOS, ((48.2, 76.7, 84.3, 94.1, 99.3), (116.2, 147.5, 245.3, 269.3, 273.3),
                                                   (187.7, 274.7, 424.1, 559.4, 686.7)), 15).monotone()
    for conf, accepted in (([0.44, 1.0, 0.65, 0.61, 0.43, 0.55, 0.5, 0.88, 0.79, 0.86, 1.0, 0.87, 0.9, 1.0, 0.6], 11),
                           ([0.42, 0.91, 0.84, 0.44, 0.89, 0.5, 1.0, 0.92, 0.73, 0.83, 0.5, 0.74, 0.3, 0.74, 0.25], 12)):
        s = prefix_scores(np.array([conf]))
        assert select_keep(s, table, overhead_ms=43.1).keep[0] < accepted
        assert select_keep(s, table, overhead_ms=43.1, cut_margin=0.1).keep == [15]
        batch = [select_keep(np.repeat(s, 16, axis=0), table, overhead_ms=196.2, cut_margin=m) for m in (0.0, 0.1)]
        assert batch[0].keep == batch[1].keep and batch[1].kept_fraction <= 0.5
        assert batch[1].cost_ms < 0.65 * batch[1].full_cost_ms


@pytest.mark.exactness
def test_a_conditioned_rows_cut_at_j_reads_only_its_confidences_up_to_j():
    """Whether position j of a conditioned row is verified may read conf[b, :j+1] (q_j and the drafts
    before j) and nothing after it (which reads d_j): redraw everything after j and the decision at j stays."""
    from engines.dcut.controller import DcutController

    rng = np.random.default_rng(3)
    K = 6
    ctl = DcutController(CostTable.linear(K, base_ms=1.0, per_token_ms=0.6, batch_sizes=(1, 2, 4, 8)), K)
    cut = 0
    for _ in range(200):
        B = int(rng.integers(1, 5))
        conf = rng.uniform(0.05, 1.0, (B, K))
        cond = list(rng.random(B) < 0.6)
        keep = ctl.select(conf, [False] * B, cond)[0].keep
        cut += sum(k < K for k in keep)
        for b in [b for b in range(B) if cond[b]]:
            for j in range(K):
                other = conf.copy()
                other[b, j + 1:] = rng.uniform(0.05, 1.0, K - j - 1)
                assert (ctl.select(other, [False] * B, cond)[0].keep[b] > j) == (keep[b] > j)
    assert cut > 0
