"""Pure routing policy: validation, precedence, learning (bandit) and fallback."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from router.routing.decide import decide
from router.routing.estimate import PoolState, expected_goodput
from router.routing.policy import (
    Canary,
    Policy,
    default_policy,
    diff_policies,
    fallback_order,
    policy_warnings,
)
from specroute.contracts.feedback import CellStats

HEALTHY = {"mtp": PoolState(True, max_running=8), "dfly": PoolState(True, max_running=8)}
CODE = {"chat": 0.05, "code": 0.9, "math": 0.05}
CHAT = {"chat": 0.9, "code": 0.05, "math": 0.05}
MATH = {"chat": 0.1, "code": 0.1, "math": 0.8}


def cell(n: float, alpha: float, k: float = 4.0, step_ms: float = 10.0) -> CellStats:
    steps = n * 20
    drafted = steps * k
    return CellStats(
        n=n, tokens=steps * (1 + k * alpha), drafted=drafted, accepted=drafted * alpha, steps=steps,
        decode_ms=steps * step_ms, t=100.0,
    )


def pol(**kw: object) -> Policy:
    base = default_policy(["mtp", "dfly"]).model_dump()
    base.update(kw)
    return Policy.model_validate(base)


def test_default_policy_routes_code_math_to_dfly_and_chat_to_mtp() -> None:
    p = pol(exploration_rate=0.0)
    rng = random.Random(0)
    assert decide(CODE, 0.1, {}, HEALTHY, p, rng) .pool == "dfly"
    assert decide(MATH, 0.1, {}, HEALTHY, p, rng).pool == "dfly"
    d = decide(CHAT, 0.1, {}, HEALTHY, p, rng)
    assert (d.pool, d.domain, d.reason) == ("mtp", "chat", "default")


def test_uncertain_goes_to_safe_pool() -> None:
    d = decide(CODE, 0.9, {}, HEALTHY, pol(), random.Random(0))
    assert (d.pool, d.reason) == ("mtp", "uncertain")


def test_pin_beats_learning_and_uncertainty() -> None:
    stats = {("code", "dfly"): cell(50, 0.1), ("code", "mtp"): cell(50, 0.9)}
    p = pol(pins={"code": "dfly"}, exploration_rate=0.0)
    for seed in range(20):
        d = decide(CODE, 0.99, stats, HEALTHY, p, random.Random(seed))
        assert (d.pool, d.reason) == ("dfly", "pin")
    assert decide(CHAT, 0.0, {}, HEALTHY, pol(pins={"*": "dfly"}), random.Random(0)).pool == "dfly"


def test_pin_to_unhealthy_pool_falls_back() -> None:
    pools = {"mtp": PoolState(True), "dfly": PoolState(False)}
    d = decide(CODE, 0.0, {}, pools, pol(pins={"code": "dfly"}), random.Random(0))
    assert (d.pool, d.reason) == ("mtp", "fallback")


def test_drained_default_falls_back() -> None:
    d = decide(CODE, 0.0, {}, HEALTHY, pol(drained=["dfly"], exploration_rate=0.0), random.Random(0))
    assert (d.pool, d.reason) == ("mtp", "fallback")


def test_no_healthy_pool() -> None:
    pools = {"mtp": PoolState(False), "dfly": PoolState(False)}
    d = decide(CODE, 0.0, {}, pools, pol(), random.Random(0))
    assert d.pool is None and d.reason == "no_healthy_pool"


def test_fallback_order_is_the_one_decide_walks() -> None:
    p = Policy(pools=["a", "b", "c", "d"], defaults={"chat": "a", "code": "a", "math": "a"}, safe_pool="c",
               fallback_order=["b", "a"], drained=["d"])
    assert fallback_order(p) == ["b", "a", "c"]
    assert fallback_order(p, first="c") == ["c", "b", "a"]
    assert fallback_order(p, first="d") == ["d", "b", "a", "c"]  # the chosen pool first, even drained
    pools = {"a": PoolState(True), "b": PoolState(False), "c": PoolState(True), "d": PoolState(True)}
    d = decide(CODE, 0.0, {}, pools, p.model_copy(update={"pins": {"code": "b"}}), random.Random(0))
    assert (d.pool, d.reason) == ("a", "fallback")


def test_canary_share_is_respected() -> None:
    p = pol(canaries=[Canary(pool="mtp", share=0.25, domains=["code"])], exploration_rate=0.0)
    rng = random.Random(1)
    picks = [decide(CODE, 0.0, {}, HEALTHY, p, rng) for _ in range(4000)]
    share = sum(d.reason == "canary" for d in picks) / len(picks)
    assert 0.22 < share < 0.28
    assert all(decide(CHAT, 0.0, {}, HEALTHY, p, rng).reason != "canary" for _ in range(200))


def test_exploration_rate() -> None:
    p = pol(exploration_rate=0.1)
    rng = random.Random(2)
    known = {("code", "dfly"): cell(30, 0.5), ("code", "mtp"): cell(30, 0.5)}   # both past min_samples
    picks = [decide(CODE, 0.0, known, HEALTHY, p, rng) for _ in range(4000)]
    explored = [d for d in picks if d.reason == "explore"]
    assert 0.08 < len(explored) / len(picks) < 0.12
    assert all(d.pool == "mtp" for d in explored)


def test_a_candidate_without_evidence_is_explored_at_the_warm_up_rate() -> None:
    # after a reset nothing is known: the other candidate gets warmup_exploration (0.25) of the domain's
    # traffic until it holds min_samples requests there, then the normal rate applies again
    p = pol(exploration_rate=0.05)
    rng = random.Random(3)
    picks = [decide(CODE, 0.0, {}, HEALTHY, p, rng) for _ in range(4000)]
    share = sum(d.reason == "explore" for d in picks) / len(picks)
    assert 0.22 < share < 0.28 and all(d.pool == "mtp" for d in picks if d.reason == "explore")
    # evidence elsewhere does not count: chat requests to mtp say nothing about mtp on code
    chat_only = {("chat", "mtp"): cell(50, 0.5), ("code", "dfly"): cell(50, 0.5)}
    picks = [decide(CODE, 0.0, chat_only, HEALTHY, p, rng) for _ in range(4000)]
    assert 0.22 < sum(d.reason == "explore" for d in picks) / len(picks) < 0.28
    # once mtp holds min_samples code requests: back to exploration_rate
    known = {**chat_only, ("code", "mtp"): cell(6, 0.5)}
    picks = [decide(CODE, 0.0, known, HEALTHY, p, rng) for _ in range(4000)]
    assert 0.03 < sum(d.reason == "explore" for d in picks) / len(picks) < 0.07
    # the operator's knobs: warmup_exploration 0 turns the warm-up off, exploration_rate 0 all exploration
    off = pol(exploration_rate=0.05, learning={**p.learning.model_dump(), "warmup_exploration": 0.0})
    picks = [decide(CODE, 0.0, {}, HEALTHY, off, rng) for _ in range(4000)]
    assert 0.03 < sum(d.reason == "explore" for d in picks) / len(picks) < 0.07
    assert all(decide(CODE, 0.0, {}, HEALTHY, pol(exploration_rate=0.0), rng).reason == "default" for _ in range(200))


def test_learning_moves_away_from_bad_acceptance() -> None:
    stats = {("code", "dfly"): cell(30, 0.05), ("code", "mtp"): cell(30, 0.7)}
    p = pol(exploration_rate=0.0)
    rng = random.Random(3)
    picks = [decide(CODE, 0.0, stats, HEALTHY, p, rng) for _ in range(200)]
    assert sum(d.pool == "mtp" for d in picks) > 190
    assert {d.reason for d in picks if d.pool == "mtp"} == {"learned"}


def test_learning_keeps_default_without_evidence() -> None:
    # the alternative has too few samples: the default stays
    stats = {("code", "dfly"): cell(30, 0.05), ("code", "mtp"): cell(1, 0.9)}
    rng = random.Random(4)
    assert all(decide(CODE, 0.0, stats, HEALTHY, pol(exploration_rate=0.0), rng).pool == "dfly" for _ in range(50))
    # with exploration on, mtp only ever gets exploration traffic (at the warm-up rate) until it has min_samples
    picks = [decide(CODE, 0.0, stats, HEALTHY, pol(exploration_rate=0.05), rng) for _ in range(200)]
    assert {d.reason for d in picks if d.pool == "mtp"} == {"explore"} and sum(d.pool == "dfly" for d in picks) > 100


def test_learning_disabled_and_ucb() -> None:
    stats = {("code", "dfly"): cell(30, 0.05), ("code", "mtp"): cell(30, 0.7)}
    off = pol(exploration_rate=0.0, learning={"enabled": False})
    assert decide(CODE, 0.0, stats, HEALTHY, off, random.Random(0)).pool == "dfly"
    ucb = pol(exploration_rate=0.0, learning={"method": "ucb"})
    d = decide(CODE, 0.0, stats, HEALTHY, ucb, random.Random(0))
    assert (d.pool, d.reason) == ("mtp", "learned") and set(d.scores) == {"mtp", "dfly"}


def test_a_scored_decision_keeps_its_context() -> None:
    """The learned and default-with-scores paths return the request's context, never a score."""
    from specroute.contracts.context import RequestContext

    stats = {("code", "dfly"): cell(30, 0.5), ("code", "mtp"): cell(30, 0.5)}
    p = pol(exploration_rate=0.0)
    for ctx in (None, RequestContext("", "latin", "0", "short")):
        d = decide(CODE, 0.0, stats, HEALTHY, p, random.Random(0), ctx)
        assert d.scores and isinstance(d.context, RequestContext)
        assert d.context.domain == ("code" if ctx is not None else "")


def test_load_penalises_goodput() -> None:
    c = cell(30, 0.5)
    p = pol()
    idle = expected_goodput(c, PoolState(True, waiting=0, max_running=8), p.learning, None)
    busy = expected_goodput(c, PoolState(True, waiting=16, max_running=8), p.learning, None)
    assert idle is not None and busy is not None and busy == pytest.approx(idle / 3)
    # (1 + k alpha) * 1000 / step_ms with the posterior mean close to 0.5
    assert idle == pytest.approx((1 + 4 * 0.5) * 100, rel=0.02)


def test_validation_errors_are_specific() -> None:
    with pytest.raises(ValidationError, match="unknown pool 'nope'"):
        pol(pins={"code": "nope"})
    with pytest.raises(ValidationError, match="missing a pool for domain 'math'"):
        pol(defaults={"chat": "mtp", "code": "dfly"})
    with pytest.raises(ValidationError, match="every pool is drained"):
        pol(drained=["mtp", "dfly"])
    with pytest.raises(ValidationError, match="add up to"):
        pol(canaries=[{"pool": "mtp", "share": 0.7}, {"pool": "dfly", "share": 0.6}])
    with pytest.raises(ValidationError):
        pol(exploration_rate=1.5)
    with pytest.raises(ValidationError):
        Policy.model_validate({**default_policy(["mtp"]).model_dump(), "bogus": 1})


def test_warnings_and_diff() -> None:
    p = pol(drained=["mtp"])
    w = policy_warnings(p, ["mtp"])
    assert any("'dfly' is not configured" in x for x in w) and any("safe_pool" in x for x in w)
    d = diff_policies(pol().model_dump(), pol(exploration_rate=0.2, version=7).model_dump())
    assert d == [{"path": "exploration_rate", "old": 0.05, "new": 0.2}]


def test_default_policy_with_other_pool_names() -> None:
    p = default_policy(["a"])
    assert p.defaults == {"chat": "a", "code": "a", "math": "a"} and p.safe_pool == "a"


@settings(max_examples=300, deadline=None)
@given(
    probs=st.dictionaries(st.sampled_from(["chat", "code", "math"]), st.floats(0, 1), min_size=0, max_size=3),
    unc=st.floats(0, 1),
    healthy=st.tuples(st.booleans(), st.booleans()),
    seed=st.integers(0, 2**32 - 1),
    alpha=st.floats(0, 1),
    n=st.floats(0, 100),
)
def test_decide_total_and_only_returns_available_pools(
    probs: dict[str, float], unc: float, healthy: tuple[bool, bool], seed: int, alpha: float, n: float
) -> None:
    pools = {"mtp": PoolState(healthy[0]), "dfly": PoolState(healthy[1])}
    stats = {(d, p): cell(n, alpha) for d in ("chat", "code", "math") for p in ("mtp", "dfly")}
    d = decide(probs, unc, stats, pools, pol(exploration_rate=0.2), random.Random(seed))
    if any(healthy):
        assert d.pool is not None and pools[d.pool].healthy
    else:
        assert d.pool is None and d.reason == "no_healthy_pool"
