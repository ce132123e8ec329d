"""D-Cut's cost table: interpolation, extrapolation, monotone repair, round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engines.dcut.cost import CostTable


def test_cost_table_interpolates_and_extrapolates():
    t = CostTable((1, 4), (0.0, 1.0), ((1.0, 3.0), (4.0, 10.0)), 4)
    assert t.cost(1, 0.5) == pytest.approx(2.0)
    assert t.cost(4, 1.0) == 10.0 and t.cost(8, 1.0) == pytest.approx(20.0)
    noisy = CostTable((1, 2), (0.0, 1.0), ((2.0, 1.0), (1.0, 1.0)), 4).monotone()
    assert noisy.ms == ((1.0, 1.0), (1.0, 1.0))            # an inversion: the larger time is the noisy one
    assert CostTable.from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_cost_many_matches_scalar_cost():
    t = CostTable((1, 4, 16), (0.0, 0.5, 1.0), ((1, 2, 3), (2, 5, 9), (5, 15, 30)), 8)
    bs = np.array([0, 1, 2, 4, 10, 16, 32])
    fr = np.array([0.3, 0.0, 0.25, 1.0, 0.75, 0.5, 1.0])
    many = t.cost_many(bs, fr)
    assert many[0] == 0.0
    assert many[1] == pytest.approx(1.0) and many[2] == pytest.approx(1.5 + 2 / 3) and many[3] == pytest.approx(9.0) and many[6] == pytest.approx(60.0)
    assert [t.cost(int(b), float(f)) for b, f in zip(bs[1:], fr[1:], strict=True)] == pytest.approx(many[1:])


def test_monotone_repair_does_not_carry_a_spike_into_longer_verification():
    """Issue #16: a profile measured on a busy machine had batch 1 at 61, 67, 76, 116, 89 ms (ratio 0,
    0.25, 0.5, 0.75, 1); raising every later cell to the largest earlier one made verifying all 15
    drafts cost 116 ms, 54% more than verifying 8. Noise only adds time: the spike is what goes."""
    raw = CostTable((1, 2), (0.0, 0.25, 0.5, 0.75, 1.0),
                    ((61.0, 67.0, 76.0, 116.0, 89.0), (90.0, 85.0, 120.0, 140.0, 160.0)), 15, (38.0, 30.0))
    t = raw.monotone()
    assert t.ms[0] == (61.0, 67.0, 76.0, 89.0, 89.0)
    assert t.ms[1] == (85.0, 85.0, 120.0, 140.0, 160.0)     # a slow plain step at batch 2: the 0.25 cell bounds it
    assert t.draft_ms == (30.0, 30.0)
    assert t.monotone() == t
    a = np.asarray(t.ms)
    assert (np.diff(a, axis=0) >= 0).all() and (np.diff(a, axis=1) >= 0).all()
