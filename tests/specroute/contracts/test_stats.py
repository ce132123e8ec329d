"""The acceptance-statistics record: steps by the drafter that drafted them, and merging."""

from __future__ import annotations

from specroute.contracts.stats import PLAIN, AcceptanceStats


def test_steps_by_drafter_and_merge():
    a = AcceptanceStats()
    a.record_step(3, 2, "mtp")
    a.record_step(0, 0, "dfly")     # D-Cut kept no drafts: a plain step, whoever proposed
    a.record_step(15, 7, "dfly")
    a.record_step(2, 1)             # an engine that cannot tell: counted, not attributed
    assert (a.drafted, a.accepted, a.steps) == (20, 10, 4)
    assert a.steps_by == {"mtp": 1, PLAIN: 1, "dfly": 1}
    b = AcceptanceStats()
    b.record_step(0, 0, PLAIN)
    m = a.merge(b)
    assert m.steps_by == {"mtp": 1, PLAIN: 2, "dfly": 1} and m.steps == 5
    assert a.steps_by == {"mtp": 1, PLAIN: 1, "dfly": 1}   # merge makes a new record
