"""The context-aware decision, directly: hierarchical back-off (context -> domain -> global), the
`ar` pool as a candidate, the load term (batch, D-Cut) and the operator overrides on top of them."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.routing.decide import decide
from router.routing.estimate import Learning, PoolState, goodput, shrink
from router.routing.policy import Policy, default_policy
from specroute.contracts.context import GLOBAL_LEVEL, RequestContext
from specroute.contracts.feedback import CellStats

CODE = {"chat": 0.05, "code": 0.9, "math": 0.05}
POOLS = ["mtp", "dfly", "ar"]
T0 = RequestContext(script="latin", temperature="0", length="short")
T1 = RequestContext(script="latin", temperature="high", length="short")
CJK_T0 = RequestContext(script="cjk", temperature="0", length="short")


def cell(n: float, alpha: float, k: float = 4.0, step_ms: float = 10.0) -> CellStats:
    """`n` decayed requests of 20 steps each drafting `k` tokens, accepting a fraction `alpha`."""
    steps = n * 20
    drafted = steps * k
    return CellStats(n=n, tokens=steps * (1 + k * alpha), drafted=drafted, accepted=drafted * alpha, steps=steps,
                     decode_ms=steps * step_ms, t=100.0)


def ar_cell(n: float, step_ms: float = 8.0) -> CellStats:
    return cell(n, 0.0, k=0.0, step_ms=step_ms)


def pol(mean: bool = True, **kw: object) -> Policy:
    """Three pools, code -> dfly by default, no exploration; `mean`: score by the posterior mean
    (UCB with c = 0) so the expected values are exact."""
    base = default_policy(POOLS).model_dump()
    base.update(exploration_rate=0.0)
    if mean:
        base["learning"] = {**base["learning"], "method": "ucb", "ucb_c": 0.0}
    learning = kw.pop("learning", None)
    base.update(kw)
    if learning:
        base["learning"] = {**base["learning"], **learning}  # type: ignore[dict-item]
    return Policy.model_validate(base)


def idle(**kw: object) -> dict[str, PoolState]:
    states = {p: PoolState(True, max_running=64, endpoints=1) for p in POOLS}
    states["ar"] = PoolState(True, max_running=64, endpoints=1, speculative=False)
    for p, state in kw.items():
        states[p] = state  # type: ignore[assignment]
    return states


def domain_stats() -> dict[tuple[str, str], CellStats]:
    """Code, domain level: dfly clearly best (MAL 3.8), mtp weaker, ar the plain speed."""
    return {("code", "dfly"): cell(100, 0.7, step_ms=12.0), ("code", "mtp"): cell(100, 0.3, step_ms=11.0),
            ("code", "ar"): ar_cell(100)}


def test_decision_carries_the_context_key() -> None:
    d = decide(CODE, 0.1, {}, idle(), pol(), random.Random(0), T0)
    assert (d.pool, d.reason, d.context.key) == ("dfly", "default", "d=code|s=latin|t=0|l=short")
    assert decide(CODE, 0.1, {}, idle(), pol(), random.Random(0)).context.key == ""
    # an unclassified request has no domain and so no context
    assert decide({}, 1.0, {}, idle(), pol(), random.Random(0), T0).context.key == ""


def test_sparse_context_follows_the_domain() -> None:
    # in the CJK context mtp looks far better, but from two requests only: the domain decides
    stats = {**domain_stats(),
             ("d=code|s=cjk|t=0|l=short", "mtp"): cell(2, 0.95, step_ms=11.0),
             ("d=code|s=cjk|t=0|l=short", "dfly"): cell(2, 0.05, step_ms=12.0)}
    d = decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), CJK_T0)
    assert (d.pool, d.reason) == ("dfly", "default")
    assert d.scores["dfly"] > d.scores["mtp"]


def test_dense_context_overrides_the_domain() -> None:
    stats = {**domain_stats(),
             ("d=code|s=cjk|t=0|l=short", "mtp"): cell(200, 0.95, step_ms=11.0),
             ("d=code|s=cjk|t=0|l=short", "dfly"): cell(200, 0.05, step_ms=12.0)}
    d = decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), CJK_T0)
    assert (d.pool, d.reason) == ("mtp", "learned")
    # ... for that context only: Latin-script code keeps the domain's choice
    assert decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), T0).pool == "dfly"
    # and Thompson sampling agrees (the dense context leaves little posterior doubt)
    rng = random.Random(7)
    picks = [decide(CODE, 0.1, stats, idle(), pol(mean=False), rng, CJK_T0).pool for _ in range(200)]
    assert picks.count("mtp") > 190


def test_shrinkage_moves_from_the_domain_to_the_context_with_evidence() -> None:
    learning = Learning()
    dom = cell(100, 0.7)
    means = []
    for n in (0.5, 2, 10, 50, 500):
        est = shrink([None, dom, cell(n, 0.1)], learning)
        assert est is not None
        means.append(est.a / (est.a + est.b))
    assert means == sorted(means, reverse=True)  # monotone toward the context's 0.1
    assert 0.6 < means[0] < 0.7 and abs(means[-1] - 0.1) < 0.02
    # with backoff_weight evidence the context sits half way between
    half = shrink([None, dom, cell(10, 0.1)], learning)
    assert half is not None and half.a / (half.a + half.b) == pytest.approx(0.4, abs=0.01)
    # step time and draft length shrink the same way
    est = shrink([None, cell(100, 0.5, k=4, step_ms=10), cell(10, 0.5, k=2, step_ms=20)], learning)
    assert est is not None and est.draft_len == pytest.approx(3.0) and est.step_ms == pytest.approx(15.0)


def test_global_level_is_a_prior_not_evidence() -> None:
    # mtp has served only chat: its global cell is dense, its code cells empty -> not scored for code
    stats = {**domain_stats(), (GLOBAL_LEVEL, "mtp"): cell(1000, 0.99, step_ms=5.0)}
    del stats[("code", "mtp")]
    d = decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), T0)
    assert "mtp" not in d.scores and d.pool == "dfly"
    # a sparse domain cell borrows from the global one
    learning = Learning()
    est = shrink([cell(1000, 0.2), cell(3, 0.9)], learning)
    assert est is not None and 0.2 < est.a / (est.a + est.b) < 0.5 and est.n == 3


def test_ar_wins_at_temperature_one_where_drafters_accept_little() -> None:
    # at T=1 every drafter accepts ~1.1 tokens per step; the T=0 evidence of the domain must not decide
    stats = {**domain_stats(),
             ("d=code|t=high", "dfly"): cell(200, 0.025, step_ms=12.0),  # MAL 1.1
             ("d=code|t=high", "mtp"): cell(200, 0.033, step_ms=11.0),  # MAL 1.1
             ("d=code|t=high", "ar"): ar_cell(200)}
    d = decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), T1)
    assert (d.pool, d.reason) == ("ar", "learned")
    assert d.scores["ar"] == pytest.approx(125.0)  # 1 token per 8 ms step
    # at T=0 the drafter keeps winning, and with Thompson sampling too
    assert decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), T0).pool == "dfly"
    rng = random.Random(11)
    assert all(decide(CODE, 0.1, stats, idle(), pol(mean=False), rng, T1).pool == "ar" for _ in range(100))


def test_non_speculative_pool_never_counts_drafts() -> None:
    # an `ar` pool's estimate is its step rate, whatever its cells say about drafting
    est = shrink([cell(50, 0.9, k=4, step_ms=8.0)], Learning())
    assert est is not None
    g = goodput(est, PoolState(True, speculative=False), Learning(), None)
    assert g == pytest.approx(125.0)


def test_load_term_flips_the_choice_at_high_batch() -> None:
    learning = {"compute_bound_tokens": 64.0}
    stats = domain_stats()
    assert decide(CODE, 0.1, stats, idle(), pol(learning=learning), random.Random(0), T0).pool == "dfly"
    busy = {p: PoolState(True, running=64, max_running=64, endpoints=1, speculative=p != "ar") for p in POOLS}
    d = decide(CODE, 0.1, stats, busy, pol(learning=learning), random.Random(0), T0)
    assert (d.pool, d.reason) == ("ar", "learned")
    # the batch is per endpoint: the same 64 requests over 8 dfly endpoints still favour speculation
    spread = {**busy, "dfly": PoolState(True, running=64, max_running=512, endpoints=8)}
    assert decide(CODE, 0.1, stats, spread, pol(learning=learning), random.Random(0), T0).pool == "dfly"


def test_a_pool_measured_compute_bound_overrides_the_fleet_guess() -> None:
    # a 2-core CPU pool turns compute-bound at ~15 tokens per forward: at batch 8 a 16-token block
    # costs 1 + 8 * 16 / 15 = 9.5 light steps, MTP's 4 tokens 3.1; with the GPU-like default (256)
    # the block drafter still looks best
    learning = Learning()
    dfly = shrink([cell(100, 0.3, k=15, step_ms=15.0)], learning)   # MAL 5.5
    mtp = shrink([cell(100, 0.5, k=3, step_ms=10.0)], learning)     # MAL 2.5
    assert dfly is not None and mtp is not None

    def ratio(bound: float | None) -> float:
        busy = PoolState(True, running=8, endpoints=1, compute_bound_tokens=bound)
        return goodput(dfly, busy, learning, None) / goodput(mtp, busy, learning, None)

    assert ratio(None) == ratio(256.0) > 1.0
    assert ratio(15.0) < 0.7
    idle = PoolState(True, running=0, endpoints=1, compute_bound_tokens=15.0)
    assert goodput(dfly, idle, learning, None) == pytest.approx(5.5 * 1000 / 15.0, rel=0.01)   # no load term


def test_speculative_advantage_tends_to_below_one_with_batch() -> None:
    learning = Learning(compute_bound_tokens=64.0)
    spec = shrink([cell(100, 0.5, k=4, step_ms=10.0)], learning)
    plain = shrink([ar_cell(100, step_ms=10.0)], learning)
    assert spec is not None and plain is not None
    ratios = []
    for b in (0, 8, 64, 512, 100_000):
        g_spec = goodput(spec, PoolState(True, running=b, endpoints=1), learning, None)
        g_ar = goodput(plain, PoolState(True, running=b, endpoints=1, speculative=False), learning, None)
        ratios.append(g_spec / g_ar)
    assert ratios[0] == pytest.approx(3.0, rel=0.01)  # MAL 3 at the same step time
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[-1] == pytest.approx(3.0 / 5.0, rel=0.01)  # (1 + k alpha) / (1 + k)


def test_dcut_drafting_less_lowers_the_estimate_never_raises_it() -> None:
    learning = Learning()
    est = shrink([cell(100, 0.5, k=4, step_ms=10.0)], learning)
    assert est is not None
    full = goodput(est, PoolState(True), learning, None)
    cutting = goodput(est, PoolState(True, draft_now=1.0), learning, None)
    off = goodput(est, PoolState(True, draft_now=0.0), learning, None)
    more = goodput(est, PoolState(True, draft_now=8.0), learning, None)
    assert off < cutting < full == more
    assert off == pytest.approx(100.0, rel=0.01)  # not drafting at all: one token per step


def test_queue_still_divides() -> None:
    learning = Learning()
    est = shrink([cell(100, 0.5)], learning)
    assert est is not None
    idle_g = goodput(est, PoolState(True, max_running=8), learning, None)
    queued = goodput(est, PoolState(True, waiting=16, max_running=8), learning, None)
    assert queued == pytest.approx(idle_g / 3)


def test_operator_overrides_beat_context_learning() -> None:
    stats = {**domain_stats(), ("d=code|t=high", "dfly"): cell(60, 0.025, step_ms=12.0),
             ("d=code|t=high", "ar"): ar_cell(60)}
    rng = random.Random(0)
    d = decide(CODE, 0.1, stats, idle(), pol(pins={"code": "dfly"}), rng, T1)
    assert (d.pool, d.reason, d.context.key) == ("dfly", "pin", "d=code|s=latin|t=high|l=short")
    assert decide(CODE, 0.9, stats, idle(), pol(), rng, T1).reason == "uncertain"
    d = decide(CODE, 0.1, stats, idle(), pol(drained=["ar"]), rng, T1)
    assert d.pool != "ar"
    d = decide(CODE, 0.1, stats, idle(), pol(canaries=[{"pool": "mtp", "share": 1.0}]), rng, T1)
    assert (d.pool, d.reason) == ("mtp", "canary")
    d = decide(CODE, 0.1, stats, idle(), pol(candidates={"code": ["mtp", "dfly"]}), rng, T1)
    assert d.pool in ("mtp", "dfly")
    assert decide(CODE, 0.1, stats, idle(), pol(learning={"enabled": False}), rng, T1).pool == "dfly"


def test_contexts_off_is_the_per_domain_policy() -> None:
    stats = {**domain_stats(), ("d=code|t=high", "dfly"): cell(60, 0.025, step_ms=12.0),
             ("d=code|t=high", "ar"): ar_cell(60), (GLOBAL_LEVEL, "dfly"): cell(500, 0.01)}
    off = pol(learning={"contexts": False})
    d = decide(CODE, 0.1, stats, idle(), off, random.Random(0), T1)
    plain = decide(CODE, 0.1, domain_stats(), idle(), off, random.Random(0))
    assert (d.pool, d.scores) == (plain.pool, plain.scores) == ("dfly", plain.scores)


def test_decide_is_deterministic_given_the_rng() -> None:
    stats = {**domain_stats(), ("d=code|t=high", "dfly"): cell(5, 0.2), ("d=code|t=high", "ar"): ar_cell(5)}
    p = pol(mean=False, exploration_rate=0.1)
    a = [decide(CODE, 0.1, stats, idle(), p, random.Random(42), T1) for _ in range(3)]
    assert a[0] == a[1] == a[2]


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    temp=st.sampled_from(["0", "low", "high"]),
    script=st.sampled_from(["latin", "cjk", "other"]),
    n=st.tuples(st.floats(0, 300), st.floats(0, 300), st.floats(0, 300)),
    alpha=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    running=st.integers(0, 10_000),
    draft_now=st.one_of(st.none(), st.floats(0, 16)),
    healthy=st.tuples(st.booleans(), st.booleans(), st.booleans()),
)
def test_decide_total_with_contexts(seed: int, temp: str, script: str, n: tuple[float, float, float],
                                    alpha: tuple[float, float], running: int, draft_now: float | None,
                                    healthy: tuple[bool, bool, bool]) -> None:
    ctx = RequestContext(script=script, temperature=temp, length="short")
    key = ctx.with_domain("code").key
    stats = {("code", "dfly"): cell(n[0], alpha[0]), (key, "dfly"): cell(n[1], alpha[1]),
             ("d=code|t=" + temp, "mtp"): cell(n[2], alpha[1], k=2), (key, "ar"): ar_cell(n[2]),
             (GLOBAL_LEVEL, "mtp"): cell(n[0], alpha[0], k=3)}
    pools = {p: PoolState(h, running=running, max_running=64, endpoints=1, speculative=p != "ar",
                          draft_now=draft_now) for p, h in zip(POOLS, healthy, strict=True)}
    d = decide(CODE, 0.1, stats, pools, pol(mean=False, exploration_rate=0.1), random.Random(seed), ctx)
    if any(healthy):
        assert d.pool is not None and pools[d.pool].healthy and d.context.key == key
    else:
        assert d.pool is None
    assert all(v >= 0 for v in d.scores.values())


def test_new_learning_knobs_stay_out_of_the_document_at_their_defaults() -> None:
    # a gateway that predates them (the document forbids unknown fields) still reads the policy
    doc = pol().model_dump(mode="json")
    assert not {"contexts", "backoff_weight", "compute_bound_tokens"} & set(doc["learning"])
    assert Policy.model_validate(doc) == pol()
    tuned = pol(learning={"backoff_weight": 3.0, "contexts": False}).model_dump(mode="json")["learning"]
    assert tuned["backoff_weight"] == 3.0 and tuned["contexts"] is False and "compute_bound_tokens" not in tuned


def test_a_plain_pool_is_trusted_on_evidence_from_every_domain() -> None:
    # `ar` has served chat only; for code its step rate is the same thing, so it is neither warm-up
    # explored there nor left out of the scores, while a drafting pool still needs code evidence
    stats = {("code", "dfly"): cell(100, 0.7, step_ms=12.0), ("code", "mtp"): cell(100, 0.3, step_ms=11.0),
             ("chat", "ar"): ar_cell(20), (GLOBAL_LEVEL, "ar"): ar_cell(20)}
    warm = pol(exploration_rate=0.05, learning={"warmup_exploration": 1.0})
    reasons = [decide(CODE, 0.1, stats, idle(), warm, random.Random(i), T0).reason for i in range(200)]
    assert 0 < reasons.count("explore") < 30   # the steady 5%, not the warm-up's 100%
    d = decide(CODE, 0.1, stats, idle(), pol(), random.Random(0), T0)
    assert "ar" in d.scores and d.pool == "dfly"
    # a drafting pool with evidence in chat only is still warmed up in code
    stats = {**stats, ("chat", "mtp"): cell(20, 0.3), (GLOBAL_LEVEL, "mtp"): cell(20, 0.3)}
    del stats[("code", "mtp")]
    d = decide(CODE, 0.1, stats, idle(), warm, random.Random(0), T0)
    assert (d.pool, d.reason) == ("mtp", "explore")
