"""Shadow policies: the pure comparison (router/routing/shadow.py), and through the admin API of a
gateway (fake engine workers writing real feedback to a real Redis): submit a candidate, watch it
decide beside the live policy without serving, promote it or discard it, each action in the policy
history. 4-7 s on two loaded cores."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx

from router.routing.decide import decide
from router.routing.estimate import PoolState
from router.routing.policy import Policy
from router.routing.shadow import compare
from router.state.shadow import clear_shadow, load_shadow, submit_shadow
from router.state.store import PolicyStore
from specroute.contracts.feedback import CellStats
from tests.router.conftest import ADMIN, engines, running_app, settings_for, snapshot_holds
from tests.router.fake_engine import FakeConfig

CODE_REQ = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 4}


def _cell(acceptance: float) -> CellStats:
    return CellStats(n=20, tokens=200, drafted=300, accepted=300 * acceptance, steps=100, decode_ms=1000, t=1.0)


def test_compare_scores_both_decisions_with_the_same_estimator() -> None:
    live = Policy(pools=["mtp", "dfly"], defaults={"chat": "mtp", "code": "dfly", "math": "dfly"}, safe_pool="mtp",
                  exploration_rate=0.0, learning={"enabled": False})
    cand = live.model_copy(update={"defaults": {"chat": "mtp", "code": "mtp", "math": "dfly"}})
    stats = {("code", "mtp"): _cell(0.8), ("code", "dfly"): _cell(0.2)}
    states = {"mtp": PoolState(True, endpoints=1), "dfly": PoolState(True, endpoints=1)}
    probs = {"chat": 0.05, "code": 0.9, "math": 0.05}
    d_live = decide(probs, 0.1, stats, states, live, random.Random(0))
    d_cand = decide(probs, 0.1, stats, states, cand, random.Random(0))
    c = compare(d_live, d_cand, stats, states, live.learning)
    assert (c.live_pool, c.shadow_pool, c.agree) == ("dfly", "mtp", False)
    assert c.live_goodput is not None and c.shadow_goodput is not None
    # 1 + 3 * alpha tokens per 10 ms step (posterior mean of alpha, shrunk toward the prior)
    assert c.shadow_goodput > 2.0 * c.live_goodput
    same = compare(d_live, d_live, stats, states, live.learning)
    assert same.agree and same.live_goodput == same.shadow_goodput


async def _policy(c: httpx.AsyncClient) -> tuple[dict[str, Any], str]:
    r = await c.get("/admin/policy", headers=ADMIN)
    doc = r.json()
    doc.pop("version")
    return doc, r.headers["etag"]


async def warm_up(c: httpx.AsyncClient) -> dict[str, Any]:
    """Evidence for both pools on code (pinned in turn), then a live policy that sends code to dfly
    without learning or exploration; returns that live document."""
    for pool in ("mtp", "dfly"):
        doc, etag = await _policy(c)
        assert (await c.put("/admin/policy", json={**doc, "pins": {"code": pool}},
                            headers={**ADMIN, "if-match": etag})).status_code == 200
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=CODE_REQ)).headers["x-specroute-pool"] == pool
    doc, etag = await _policy(c)
    live = {**doc, "pins": {}, "exploration_rate": 0.0, "learning": {**doc["learning"], "enabled": False}}
    assert (await c.put("/admin/policy", json=live, headers={**ADMIN, "if-match": etag})).status_code == 200
    await snapshot_holds(c.app.state.gateway, {"mtp": 3, "dfly": 3})  # type: ignore[attr-defined]
    return live


def workers(redis_url: str) -> tuple[FakeConfig, FakeConfig]:
    return (FakeConfig(name="mtp", engine="mtp", acceptance={"code": 0.8}, redis_url=redis_url),
            FakeConfig(name="dfly", engine="dfly", acceptance={"code": 0.2}, redis_url=redis_url))


async def test_submit_compare_promote_and_discard(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    async with engines(*workers(redis_url)) as es, running_app(
            settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, stats_interval_s=0.05,
                         access_log=True, access_log_file=log)) as c:
        live = await warm_up(c)
        assert (await c.get("/admin/shadow", headers=ADMIN)).json()["shadow"] is None
        assert (await c.post("/admin/shadow/promote", json={}, headers=ADMIN)).json()["error"]["code"] == "no_shadow_policy"
        bad = await c.put("/admin/shadow", json={**live, "safe_pool": "nope"}, headers=ADMIN)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_policy"

        cand = {**live, "defaults": {**live["defaults"], "code": "mtp"}, "comment": "code to mtp"}
        r = await c.put("/admin/shadow", json=cand, headers=ADMIN)
        assert r.status_code == 200, r.text
        sid = r.json()["shadow"]["id"]
        for _ in range(4):  # the live policy serves; the shadow only decides
            assert (await c.post("/v1/chat/completions", json=CODE_REQ)).headers["x-specroute-pool"] == "dfly"
        cmp_ = (await c.get("/admin/shadow", headers=ADMIN)).json()["comparison"]
        assert (cmp_["shadow_id"], cmp_["requests"], cmp_["agree"], cmp_["scored"]) == (sid, 4, 0, 4)
        assert cmp_["shadow_goodput"] > cmp_["live_goodput"] > 0 and cmp_["gain"] > 0.5
        assert cmp_["pools"] == [{"live": "dfly", "shadow": "mtp", "requests": 4}]
        assert 'specroute_shadow_decisions_total{live_pool="dfly",shadow_pool="mtp"} 4.0' in (await c.get("/metrics")).text

        stale = await c.post("/admin/shadow/promote", json={"id": "someone-else"}, headers=ADMIN)
        assert stale.status_code == 409
        r = await c.post("/admin/shadow/promote", json={"id": sid, "note": "wins"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        version = r.json()["policy"]["version"]
        assert (await c.get("/admin/shadow", headers=ADMIN)).json()["shadow"] is None
        assert (await c.post("/v1/chat/completions", json=CODE_REQ)).headers["x-specroute-pool"] == "mtp"
        hist = (await c.get("/admin/policy/versions", headers=ADMIN)).json()["versions"]
        assert [h["action"] for h in hist[:2]] == ["shadow:promote", "shadow:submit"]
        assert hist[0]["version"] == version and hist[0]["shadow_id"] == sid and hist[0]["actor"] == "ops"
        assert hist[0]["comparison"]["requests"] == 4 and hist[0]["note"] == "wins"
        assert hist[1]["shadow"] is True and hist[1]["diff"] == [{"path": "comment", "old": live["comment"],
                                                                  "new": "code to mtp"},
                                                                 {"path": "defaults.code", "old": "dfly", "new": "mtp"}]

        # discard: audited, and the live policy is untouched; a rollback never lands on a shadow entry
        r = await c.put("/admin/shadow", json=live, headers=ADMIN)
        sid2 = r.json()["shadow"]["id"]
        assert (await c.request("DELETE", "/admin/shadow", headers=ADMIN)).json() == {"discarded": sid2}
        hist = (await c.get("/admin/policy/versions", headers=ADMIN)).json()["versions"]
        assert [h["action"] for h in hist[:2]] == ["shadow:discard", "shadow:submit"]
        assert (await _policy(c))[0]["defaults"]["code"] == "mtp"
        rb = await c.post("/admin/policy/rollback", json={"version": version}, headers=ADMIN)
        assert rb.status_code == 200 and rb.json()["defaults"]["code"] == "mtp"
        assert (await c.get("/admin/shadow")).status_code == 401
    # logged, not served: the access log names the shadow's pool beside the one that served
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["pool"], x.get("shadow_pool")) for x in lines if x.get("shadow_pool")] == [("dfly", "mtp")] * 4


async def test_clearing_a_replaced_candidate_keeps_the_new_one(redis_url: str) -> None:
    store = PolicyStore(redis_url)
    live = Policy(pools=["mtp"], defaults={"chat": "mtp", "code": "mtp", "math": "mtp"}, safe_pool="mtp")
    try:
        old = await submit_shadow(store, live, "ops", live, "")
        new = await submit_shadow(store, live.model_copy(update={"comment": "b"}), "ops", live, "")
        assert not await clear_shadow(store, old, "ops", live, "")   # the one discarded was replaced meanwhile
        assert (await load_shadow(store)) == new
        assert await clear_shadow(store, new, "ops", live, "gone")
        assert await load_shadow(store) is None
        assert [e["action"] for e in await store.versions(3)] == ["shadow:discard", "shadow:submit", "shadow:submit"]
    finally:
        await store.close()
