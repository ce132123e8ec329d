"""bench/exactness.py: the T > 0 exactness figure's histogram sampler and chi-square test."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.exactness import first_tokens, homogeneity_p
from engines.sampling import SamplingParams
from engines.spec import SpecDecoder
from tests.engines.test_spec import _real_drafter, make_target, prompts

pytestmark = pytest.mark.exactness


def test_homogeneity_p_separates_equal_from_different_histograms():
    a = Counter({(1,): 300, (2,): 200, (3,): 100})
    assert homogeneity_p(a, Counter(a)) == pytest.approx(1.0)
    assert homogeneity_p(a, Counter({(1,): 100, (2,): 200, (3,): 300})) < 1e-6
    assert homogeneity_p(Counter({(1,): 3}), Counter({(2,): 2})) == 1.0   # too few counts: nothing to test


def test_first_tokens_through_a_drafter_match_plain_decoding():
    target = make_target()
    ids = prompts(1, seed=40, lo=4, hi=8)[0]
    hot = SamplingParams(temperature=1.0)
    ar = first_tokens(SpecDecoder(target, None, 50, 32), ids, hot, 400, 0, seed=1)
    got = first_tokens(SpecDecoder(target, _real_drafter("mtp", target, 0).eval(), 50, 32), ids, hot, 400, 2, seed=2)
    assert sum(ar.values()) == sum(got.values()) == 400 and all(len(t) == 3 for t in got)
    assert homogeneity_p(got, ar) > 1e-3


def test_rare_tuples_back_off_to_their_prefix():
    """Every three-token tuple is rare, but their first tokens are not: a difference there is found."""
    a = Counter({(1, i, j): 1 for i in range(20) for j in range(20)} | {(2, i, j): 1 for i in range(10) for j in range(10)})
    b = Counter({(2, i, j): 1 for i in range(20) for j in range(20)} | {(1, i, j): 1 for i in range(10) for j in range(10)})
    assert homogeneity_p(a, b) < 1e-6 and homogeneity_p(a, Counter(a)) == pytest.approx(1.0)


def test_combined_power_and_detectable_shift():
    """Summed chi-square statistics give one p-value; the power against a second-token shift grows
    with the shift and the sample size, and the detectable shift is where it reaches 0.9."""
    from bench.exactness import combined_p, detectable_shift, power, shift_second

    assert combined_p([(0.0, 3), (1.0, 2)]) > 0.95 and combined_p([(40.0, 3), (30.0, 2)]) < 1e-6
    ref = Counter({(1, 2, 3): 500, (1, 4, 3): 300, (2, 2, 2): 200})
    q = shift_second(ref, 0.05)
    assert sum(q.values()) == pytest.approx(1.0)
    assert q[(1, 2, 3)] == pytest.approx(0.5 + 0.05 * 0.8) and q[(2, 2, 2)] == pytest.approx(0.2)
    assert power([ref], 2000, 1e-3, 0.02) < power([ref], 2000, 1e-3, 0.05) < power([ref], 8000, 1e-3, 0.05)
    d = detectable_shift([ref], 2000, 1e-3)
    assert 0.0 < d < 0.5 and power([ref], 2000, 1e-3, d) >= 0.9
