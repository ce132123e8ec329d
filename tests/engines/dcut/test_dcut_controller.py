"""DcutController: observation, the live switch, and plain steps with probes where drafting loses."""

from __future__ import annotations

import numpy as np
import pytest

from engines.dcut.controller import PROBE_MAX, DcutController, next_probe_interval, row_estimate
from engines.dcut.cost import PROFILE_RATIOS, CostTable


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


# --- batch 1: one request at a time (issue #16) ------------------------------------------------------


def _demo_like_table(K: int = 15) -> CostTable:
    """The demo bundle's D-Cut profile at batch 1 on one CPU thread: a plain step 6.2 ms, verifying 15
    drafts 11 ms, one DFly pass 7 ms (batch 2 only so that the table interpolates)."""
    return CostTable((1, 2), PROFILE_RATIOS, ((6.2, 7.8, 9.1, 11.0, 11.0), (6.3, 8.5, 10.5, 14.7, 14.7)),
                     K).with_draft_ms((7.0, 8.0))


def _serve_alone(ctl: DcutController | None, accept, conf: float, tokens: int = 256, draft_ms: float = 7.0) -> float:
    """One request running alone, driven the way `Batcher._decode` drives the controller at batch 1.
    `accept(n)`: drafts the target accepts when n tokens have been emitted (at T=0, what verifying every
    draft would accept); `ctl=None`: plain DFly (offline). Returns the request's mean accepted length as
    the worker reports it (plain steps count as steps that accepted nothing)."""
    K = ctl.k if ctl is not None else 15
    row = (0, 0)                                     # the batcher's (drafted steps, tokens they emitted)
    steps = accepted = 0
    n = 1
    while n < tokens:
        k = min(K, tokens - n - 1)
        if ctl is not None and k > 0 and ctl.rows_to_draft([row]) != [0]:
            steps, n = steps + 1, n + 1              # a plain step
            continue
        keep = k
        if ctl is not None and k > 0:
            sel, raw = ctl.select(np.full((1, k), conf), [False])
            keep = sel.keep[0]
        a = min(accept(n), keep)
        if ctl is not None and k > 0:
            ctl.observe(raw, [keep], [a], keep / K, overhead_ms=draft_ms, verify_ms=sel.cost_ms, sel=sel)
            row = (row[0] + 1, row[1] + a + 1)
        steps, accepted, n = steps + 1, accepted + a, n + a + 1
    return (steps + accepted) / steps


def test_a_request_alone_is_not_judged_on_the_previous_requests_acceptance():
    """Issue #16: at concurrency 1 a code request that followed a chat request whose tail accepted
    nothing took that tail as its prior (the fleet average was an EMA over the last ~10 drafted steps),
    ran plain steps with probes 8, 16, 32, ... steps apart and lost ~20% of offline DFly's mean
    accepted length, though its drafts pay."""
    ctl = DcutController(_demo_like_table(), 15)
    _serve_alone(ctl, lambda n: 7, 0.9)                                   # math
    _serve_alone(ctl, lambda n: 2, 0.6)                                   # chat
    _serve_alone(ctl, lambda n: 2 if n < 60 else 0, 0.6, tokens=120)      # chat whose tail accepts nothing
    code = lambda n: 1 if n < 12 else 7                                   # noqa: E731  a slow first line, then 7 a step
    assert _serve_alone(ctl, code, 0.9) >= 0.9 * _serve_alone(None, code, 0.9)


def test_a_hopeless_request_alone_still_falls_back_to_plain_steps():
    ctl = DcutController(_demo_like_table(), 15)
    _serve_alone(ctl, lambda n: 7, 0.9)
    skipped = ctl.skipped_steps
    assert _serve_alone(ctl, lambda n: 0, 0.3) < 1.1                      # nothing accepted: (almost) all plain
    assert ctl.skipped_steps - skipped > 200


def test_fleet_average_spans_many_rows_and_a_row_alone_is_probed_at_once():
    ctl = DcutController(_demo_like_table(), 15)
    for _ in range(100):                                                  # a long history of good rows
        _spec_step(ctl, np.full((1, 15), 0.9), [7], 7.0)
    assert ctl.tokens_per_row_ema == pytest.approx(8.0)
    for _ in range(10):                                                   # one request's bad stretch
        _spec_step(ctl, np.full((1, 15), 0.3), [0], 7.0)
    assert ctl.tokens_per_row_ema > 6.5                                   # moves the prior, does not replace it
    _spec_step(ctl, np.full((32, 15), 0.3), [0] * 32, 7.0)               # a batch of 32 rows weighs 32 rows
    assert ctl.tokens_per_row_ema < 5.0
    # alone, a plain stretch starts with a probe (the probe is the step), then waits 8, 16, ... steps
    bad = (40, 40)
    assert not ctl.pays(1, 1.0)
    decisions = [ctl.rows_to_draft([bad]) for _ in range(1 + 8 + 1 + 16 + 1)]
    assert [i for i, d in enumerate(decisions) if d] == [0, 9, 26]


def test_new_rows_start_from_their_temperature_buckets_acceptance():
    """Greedy rows accept everything, T=1 rows nothing: a new T=1 row's prior is the T=1 rows' average
    (no drafting at batch 2), a new greedy row's the greedy rows' (drafting), not one fleet average."""
    K = 4
    table = CostTable.linear(K, base_ms=5.0, per_token_ms=0.5, batch_sizes=(1, 8)).with_draft_ms((3.0, 6.0))
    ctl = DcutController(table, K)
    for _ in range(10):
        sel, raw = ctl.select(np.full((2, K), 0.5), [False, False])
        ctl.observe(raw, sel.keep, [K, 0], sel.kept_fraction, buckets=["0", "high"])
    assert ctl.row_prior("0") > 4.5 and ctl.row_prior("high") == 1.0
    assert ctl.row_prior("0") > ctl.row_prior(None) > ctl.row_prior("high") == 1.0
    assert ctl.rows_to_draft([(0, 0), (0, 0)], ["0", "0"]) == [0, 1]
    assert ctl.rows_to_draft([(0, 0), (0, 0)], ["high", "high"]) == []
    assert ctl.row_prior("low") == ctl.row_prior(None)   # no observation yet: the fleet average


# a served math request (held-out aqua/dev-181, block 16, T=0): drafts plain DFly accepted per step.
# Ten steps of about one token (restating the problem), then the bursts that make drafting pay.
MATH_OPENING_THEN_BURSTS = [1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 1, 1, 5, 5, 5, 4] + [0, 4] * 13 + [2]


def _replay(steps: list[int]):
    """accept(n) for `_serve_alone` from plain DFly's per-step acceptances: a step that starts inside
    one of plain DFly's accepted runs accepts what is left of it."""
    starts, n = [], 1
    for a in steps:
        starts.append((n, a))
        n += a + 1

    def accept(n: int) -> int:
        s, a = max((s, a) for s, a in starts if s <= n)
        return max(0, a - (n - s))
    return accept, n


def _served_table() -> CostTable:
    """The D-Cut profile the served run measured (one busy CPU thread): a plain step 52 ms, verifying
    any number of drafts 88 ms, one DFly pass 24 ms; drafting pays from ~2 tokens a step."""
    return CostTable((1, 2), PROFILE_RATIOS, ((52.4, 87.7, 87.7, 87.7, 87.7), (81.6, 101.6, 116.7, 134.7, 158.8)),
                     15).with_draft_ms((23.7, 37.1))


@pytest.mark.parametrize("old", [True, False])
def test_a_math_request_that_opens_slowly_keeps_drafting_through_its_bursts(old):
    """Issue #16: at concurrency 1 this request drafted its first ten steps (~1.2 tokens each), stopped
    (its record outweighed the bucket's average of ~4), and its probes came 8, 16, 32, 64 plain steps
    apart, too few to pull a record of 13 steps back over the ~2 tokens a step where drafting pays: the
    bursts that followed ran as 120 plain steps, a mean accepted length of 1.06 against offline
    DFly's 2.70. The bucket's average now counts as 12 steps and a row alone is probed at least
    every 16 plain steps."""
    kw = {"row_prior_weight": 4.0, "probe_alone_max": PROBE_MAX} if old else {}
    ctl = DcutController(_served_table(), 15, **kw)
    for _ in range(3):                                                    # earlier requests: ~4 tokens a step
        _serve_alone(ctl, lambda n: 3, 0.9, tokens=128, draft_ms=23.7)
    accept, tokens = _replay(MATH_OPENING_THEN_BURSTS)
    offline = _serve_alone(None, accept, 0.9, tokens=tokens)
    served = _serve_alone(ctl, accept, 0.9, tokens=tokens, draft_ms=23.7)
    assert offline == pytest.approx(2.7, abs=0.05)
    if old:
        assert served < 0.6 * offline                                     # the loss, reproduced
    else:
        assert served >= 0.9 * offline


def test_row_estimate_and_probe_interval_are_pure():
    assert row_estimate((0, 0), 4.0) == 4.0                               # no record: the bucket's average
    assert row_estimate((10, 12), 4.0, prior_weight=4.0) == pytest.approx(2.0)
    assert row_estimate((10, 12), 4.0) == pytest.approx((12 + 48) / 22)  # 12 pseudo-steps of the average
    assert row_estimate((1000, 1000), 4.0) < 1.05                         # a long record outweighs it
    assert [next_probe_interval(e, 8) for e in (0, 8, 64, 512, 1024)] == [8, 16, 128, 1024, 1024]
    assert [next_probe_interval(e, 1) for e in (0, 8, 16, 64)] == [8, 16, 16, 16]


def test_a_row_alone_that_stopped_drafting_is_probed_at_least_every_16_plain_steps():
    """At batch 1 the probe interval stops doubling at 16: a long request whose acceptance comes back
    drafts again within 17 steps instead of after 64, 128, 256, ... plain steps."""
    ctl = DcutController(_demo_like_table(), 15)
    _spec_step(ctl, np.full((1, 15), 0.3), [0], 7.0)
    decisions = [ctl.rows_to_draft([(40, 40)]) for _ in range(200)]
    probes = [i for i, d in enumerate(decisions) if d]
    assert probes[:3] == [0, 9, 26] and max(np.diff(probes)) == 17
    assert ctl.skipped_steps == 200 - len(probes)                         # still plain steps in between
