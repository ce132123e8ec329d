"""Change detection on the learned statistics (router/routing/drift.py), directly: a drafter that goes bad is
judged on the evidence since the change (its contexts too) and the policy leaves it at once; the mark
holds while traffic moves away and is lifted when the old evidence has decayed or agrees again."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from router.routing.decide import decide
from router.routing.drift import adjust, has_shifted, level_domain, split
from router.routing.estimate import Learning, PoolState
from router.routing.policy import Policy, default_policy
from specroute.contracts.context import GLOBAL_LEVEL, RequestContext
from specroute.contracts.feedback import CellStats
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

HL = 300.0
LEARN = Learning()
CTX = "d=code|s=latin|t=0|l=short"
CODE = {"chat": 0.05, "code": 0.9, "math": 0.05}


def cell(n: float, alpha: float, k: float = 4.0, t: float = 1000.0) -> CellStats:
    """`n` requests of 20 steps drafting `k` tokens each, accepting a fraction `alpha`."""
    steps = n * 20
    drafted = steps * k
    return CellStats(n=n, tokens=steps * (1 + k * alpha), drafted=drafted, accepted=drafted * alpha, steps=steps,
                     decode_ms=steps * 10.0, t=t)


def add(a: CellStats, b: CellStats, t: float) -> CellStats:
    """`a` aged to `t` plus `b` (what Redis holds after `b`'s records arrive)."""
    a = a.decayed_to(t, HL)
    return CellStats(**{k: getattr(a, k) + getattr(b, k) for k in ("n", "tokens", "drafted", "accepted", "steps",
                                                                    "decode_ms", "ttft_ms", "wall_ms")}, t=t)


def aged(cells: dict[tuple[str, str], CellStats], t: float) -> dict[tuple[str, str], CellStats]:
    return {c: s.decayed_to(t, HL) for c, s in cells.items()}


def before() -> dict[tuple[str, str], CellStats]:
    """Minutes of good evidence: dfly accepts 70% on code, mtp 40%; chat on dfly steady."""
    return {("code", "dfly"): cell(100, 0.7), (CTX, "dfly"): cell(60, 0.7), ("code", "mtp"): cell(40, 0.4, k=3),
            ("chat", "dfly"): cell(50, 0.3), (GLOBAL_LEVEL, "dfly"): cell(150, 0.57)}


def test_split_and_level_domain():
    then = cell(100, 0.7)
    now = add(then, cell(10, 0.0), 1030.0)
    older, recent = split(now, then, 1030.0, HL)
    assert abs(older.n - 100 * 0.5 ** (30 / HL)) < 1e-9 and abs(recent.n - 10) < 1e-9
    assert abs(recent.accepted) < 1e-6 and recent.mean_accepted_length == 1.0
    assert split(now, None, 1030.0, HL)[1] is now                    # a new cell: all of it is recent
    assert split(cell(5, 0.1, t=1030.0), then, 1030.0, HL)[1].n == 0   # reset in between: nothing recent
    assert [level_domain(x) for x in ("code", CTX, "d=math|t=0", GLOBAL_LEVEL)] == ["code", "code", "math", None]


def test_has_shifted_needs_evidence_on_both_sides_and_a_real_gap():
    assert has_shifted(cell(50, 0.7), cell(10, 0.0), LEARN)
    assert not has_shifted(cell(50, 0.7), cell(9, 0.0), LEARN)      # too few recent requests
    assert not has_shifted(cell(9, 0.7), cell(50, 0.0), LEARN)      # too little past to contradict
    assert not has_shifted(cell(50, 0.7), cell(20, 0.55), LEARN)    # MAL 3.8 vs 3.2: noise, not a change


def test_a_degraded_drafter_is_judged_on_the_evidence_since_and_loses_the_traffic():
    then = before()
    # 30 s later: 20 code requests on dfly accepted nothing (its context got 12 of them), chat is steady
    now = aged(then, 1030.0)
    now[("code", "dfly")] = add(then[("code", "dfly")], cell(20, 0.0, k=1.0), 1030.0)
    now[(CTX, "dfly")] = add(then[(CTX, "dfly")], cell(12, 0.0, k=1.0), 1030.0)
    now[("chat", "dfly")] = add(then[("chat", "dfly")], cell(10, 0.3), 1030.0)
    now[(GLOBAL_LEVEL, "dfly")] = add(then[(GLOBAL_LEVEL, "dfly")], cell(30, 0.15, k=2.0), 1030.0)
    view = adjust(now, [(1000.0, then)], {}, 1030.0, HL, LEARN)
    assert view.shifted == {("code", "dfly"), (GLOBAL_LEVEL, "dfly")}   # every domain of dfly: MAL 3.3 -> 1.3
    assert abs(view.cells[("code", "dfly")].n - 20) < 1e-6 and view.cells[("code", "dfly")].accepted < 1e-6
    assert abs(view.cells[(CTX, "dfly")].n - 12) < 1e-6                # its context: the evidence since too
    assert view.cells[("chat", "dfly")] == now[("chat", "dfly")]       # other domains untouched
    assert abs(view.cells[(GLOBAL_LEVEL, "dfly")].n - 30) < 1e-6
    policy = Policy.model_validate({**default_policy(["mtp", "dfly"]).model_dump(), "exploration_rate": 0.0,
                                    "learning": {"method": "ucb", "ucb_c": 0.0}})
    pools = {p: PoolState(True, max_running=64, endpoints=1) for p in ("mtp", "dfly")}
    ctx = RequestContext(script="latin", temperature="0", length="short")
    assert decide(CODE, 0.0, now, pools, policy, random.Random(0), ctx).pool == "dfly"   # the past still wins
    d = decide(CODE, 0.0, view.cells, pools, policy, random.Random(0), ctx)
    assert (d.pool, d.reason) == ("mtp", "learned")

    # another 30 s: traffic has left dfly, only 2 explored requests arrived; the mark holds
    later = aged(now, 1060.0)
    later[("code", "dfly")] = add(now[("code", "dfly")], cell(2, 0.0, k=1.0), 1060.0)
    view2 = adjust(later, [(1000.0, then), (1030.0, now)], view.baselines, 1060.0, HL, LEARN)
    assert ("code", "dfly") in view2.shifted and abs(view2.cells[("code", "dfly")].n - (20 * 0.5 ** (30 / HL) + 2)) < 1e-6
    assert decide(CODE, 0.0, view2.cells, pools, policy, random.Random(0), ctx).pool == "mtp"

    # the drafter is restored: 200 good requests since outweigh the bad ones and agree with the past
    fixed = aged(later, 1120.0)
    fixed[("code", "dfly")] = add(later[("code", "dfly")], cell(200, 0.7), 1120.0)
    assert ("code", "dfly") not in adjust(fixed, [], view2.baselines, 1120.0, HL, LEARN).shifted
    # or the newest evidence alone is back to what it was before the change (12 good requests)
    back = aged(later, 1070.0)
    back[("code", "dfly")] = add(later[("code", "dfly")], cell(12, 0.7), 1070.0)
    hist = [(1000.0, then), (1030.0, now), (1060.0, later)]
    assert ("code", "dfly") not in adjust(back, hist, view2.baselines, 1070.0, HL, LEARN).shifted
    still = aged(later, 1070.0)   # ... but not while it is still bad
    still[("code", "dfly")] = add(later[("code", "dfly")], cell(12, 0.05), 1070.0)
    assert ("code", "dfly") in adjust(still, hist, view2.baselines, 1070.0, HL, LEARN).shifted
    # or the pre-change evidence has decayed away (an hour on): the whole cell applies again
    hour = aged(later, 4660.0)
    assert adjust(hour, [], view2.baselines, 4660.0, HL, LEARN).shifted == frozenset()


def test_the_newest_evidence_that_is_enough_to_judge_is_compared_with_the_rest():
    """Pulls at 1000, 1025 and 1029: 60 good requests, then 12 bad, then 1 more by 1030. The latest
    pull with >= 10 requests since is 1025's: 13 bad ones against everything before. Since 1000 the
    good would have drowned them; the window bounds how far back the look may reach."""
    key = ("code", "dfly")
    p0 = {key: cell(100, 0.7)}
    p1 = {key: add(p0[key], cell(60, 0.7), 1025.0)}
    p2 = {key: add(p1[key], cell(12, 0.0, k=1.0), 1029.0)}
    now = {key: add(p2[key], cell(1, 0.0, k=1.0), 1030.0)}
    hist = [(1000.0, p0), (1025.0, p1), (1029.0, p2)]
    view = adjust(now, hist, {}, 1030.0, HL, LEARN)
    assert view.shifted == {key} and abs(view.cells[key].n - (12 * 0.5 ** (1 / HL) + 1)) < 1e-6
    assert not has_shifted(*split(now[key], p0[key], 1030.0, HL), LEARN)   # 73 requests since 1000: no
    assert adjust(now, hist, {}, 1030.0, HL, Learning(drift_window_s=3.0)).shifted == frozenset()


def test_steady_evidence_is_left_alone_and_a_zero_window_turns_it_off():
    then = before()
    now = {c: add(s, cell(10, s.acceptance_rate or 0.0), 1030.0) for c, s in then.items()}
    assert adjust(now, [(1000.0, then)], {}, 1030.0, HL, LEARN).shifted == frozenset()
    bad = dict(now)
    bad[("code", "dfly")] = add(then[("code", "dfly")], cell(20, 0.0), 1030.0)
    assert adjust(bad, [(1000.0, then)], {}, 1030.0, HL, LEARN).shifted == {("code", "dfly")}
    off = Learning(drift_window_s=0.0)
    assert adjust(bad, [(1000.0, then)], {}, 1030.0, HL, off).cells == bad
    assert adjust(bad, [], {}, 1030.0, HL, LEARN).shifted == frozenset()   # no earlier pull yet


async def _ask_code(c: httpx.AsyncClient) -> str:
    r = await c.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "write python code that sorts a list"}],
        "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return str(r.headers["x-specroute-pool"])


async def _set(c: httpx.AsyncClient, **changes: object) -> None:
    r = await c.get("/admin/policy", headers=ADMIN)
    doc = r.json()
    learning = {**doc["learning"], **changes.pop("learning", {})}  # type: ignore[dict-item]
    r = await c.put("/admin/policy", json={**doc, **changes, "learning": learning},
                    headers={**ADMIN, "if-match": r.headers["etag"]})
    assert r.status_code == 200, r.text


@pytest.mark.timeout(120)
@pytest.mark.asyncio(loop_scope="session")
async def test_the_gateway_sees_a_drafter_go_bad_where_decayed_statistics_would_not(redis_url: str) -> None:
    """Fake workers writing real feedback to a real Redis. An hour's half-life and plenty of good DFly
    evidence: with change detection off (no change can gather the evidence it asks for), code keeps
    going to DFly for several requests after its acceptance falls to 0; turned on, the gateway marks code x dfly as changed and moves code to MTP within a few requests."""
    dfly = FakeConfig(name="dfly", engine="dfly", acceptance={"code": 0.8}, step_ms=12.0, redis_url=redis_url)
    mtp = FakeConfig(name="mtp", engine="mtp", block_size=3, acceptance={"code": 0.5}, redis_url=redis_url)
    async with engines(mtp, dfly) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, stats_interval_s=0.05)
    ) as c:
        learning = {"method": "ucb", "ucb_c": 0.0, "min_samples": 3, "evidence_per_request": 16.0,
                    "drift_window_s": 1.0, "drift_min_requests": 1e6}   # no change ever has that much evidence
        for pool, n in (("mtp", 10), ("dfly", 60)):
            await _set(c, exploration_rate=0.0, half_life_s=3600.0, pins={"code": pool}, learning=learning)
            for _ in range(n):
                assert await _ask_code(c) == pool
        await _set(c, pins={})
        await asyncio.sleep(1.2)   # the gateway's pulls now reach back past the good evidence
        assert [await _ask_code(c) for _ in range(3)] == ["dfly"] * 3
        es[1].servicer.cfg.acceptance["code"] = 0.0            # the DFly drafter goes bad
        # the past outweighs the first bad requests: decayed statistics alone tip only after 14-26 of them
        # (four runs, CI's included; how soon depends on when the gateway pulls their feedback)
        off = [await _ask_code(c) for _ in range(5)]
        assert off == ["dfly"] * 5, off
        await _set(c, learning={**learning, "drift_min_requests": 4})
        await asyncio.sleep(0.3)   # a few pulls (every 0.05 s here): the next one marks the change
        on = [await _ask_code(c) for _ in range(10)]
        print(f"detection off: {off}\ndetection on: {on}")
        assert on == ["mtp"] * 10, on
        view = (await c.get("/admin/stats", headers=ADMIN)).json()
        assert {"domain": "code", "pool": "dfly"} in view["shifted"], view["shifted"]
        metrics = (await c.get("/metrics")).text
        assert 'specroute_learning_shifts_total{domain="code",pool="dfly"} 1.0' in metrics
