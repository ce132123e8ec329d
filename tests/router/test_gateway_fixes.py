"""Issue #14's gateway fixes, one test each: a restarted worker's new `Info` (model, engine) is seen
on reconnect and periodically; a policy fallback because a pool is down counts in
`specroute_fallbacks_total`; the client's `x-request-id` is honoured (bounded, sanitised) down to the
worker and the feedback record; the half-open breaker lets exactly one trial request through.
(The dashboard's fixes: tests/router/test_dashboard_browser.py.)"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis

from router.http.request_id import MAX_CHARS, request_id
from router.workers.endpoint import Endpoint
from specroute.contracts.feedback import FEEDBACK_STREAM
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig, FakeEngine

pytestmark = pytest.mark.timeout(60)
ASYNC = pytest.mark.asyncio(loop_scope="session")


def chat(text: str, model: str = "specroute") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 3}


async def _until(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    t_end = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < t_end, "condition not met in time"
        await asyncio.sleep(0.05)


async def _models(c: httpx.AsyncClient) -> list[str]:
    return [m["id"] for m in (await c.get("/v1/models")).json()["data"]]


@ASYNC
async def test_restarted_worker_with_another_model_is_seen_on_reconnect() -> None:
    old = await FakeEngine(FakeConfig(model_id="model-a", engine="mtp")).start()
    port = old.port
    settings = settings_for({"mtp": [old.address]}, None, info_interval_s=3600)
    new: FakeEngine | None = None
    try:
        async with running_app(settings) as c:
            assert "model-a" in await _models(c)
            await old.stop()
            await asyncio.sleep(0.3)  # the health check sees it gone
            # a slow Load: the check that learns the new model finishes a while after its Info call (as on a
            # loaded machine); the new model must not be listed before the endpoint can serve it
            new = await FakeEngine(FakeConfig(model_id="model-b", engine="dfly", load_delay_s=0.3), port=port).start()

            async def swapped() -> bool:
                return "model-b" in await _models(c)

            await _until(swapped)
            assert "model-a" not in await _models(c)
            r = await c.post("/v1/chat/completions", json=chat("hello", model="model-b"))
            assert r.status_code == 200, r.text
            pools = (await c.get("/admin/pools", headers=ADMIN)).json()
            assert pools["mtp"]["endpoints"][0]["info"]["engine"] == "dfly"
    finally:
        if new is not None:
            await new.stop()


@ASYNC
async def test_worker_info_is_refreshed_periodically() -> None:
    async with engines(FakeConfig(model_id="model-a")) as es, running_app(
        settings_for({"mtp": [es[0].address]}, None, info_interval_s=0.2)
    ) as c:
        assert await _models(c) == ["model-a", "specroute"]
        es[0].servicer.cfg.model_id = "model-c"  # the same process now says another model (no outage)

        async def changed() -> bool:
            return "model-c" in await _models(c)

        await _until(changed, 3.0)


@ASYNC
async def test_policy_fallback_for_a_down_pool_is_counted() -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, None)
    ) as c:
        await es[1].stop()
        await asyncio.sleep(0.3)
        r = await c.post("/v1/chat/completions", json=chat("write python code"))  # code -> dfly by default
        assert r.status_code == 200 and r.headers["x-specroute-pool"] == "mtp"
        assert r.headers["x-specroute-reason"] == "fallback"
        metrics = (await c.get("/metrics")).text
        assert 'specroute_fallbacks_total{from="dfly",reason="pool_down",to="mtp"} 1.0' in metrics


def test_request_id_is_bounded_and_sanitised() -> None:
    assert request_id(b"abc-123_x.y:z") == "abc-123_x.y:z"
    assert request_id(b"a b\r\n<script>c") == "abscriptc"
    assert len(request_id(b"x" * 1000)) == MAX_CHARS
    fresh = request_id(None)
    assert len(fresh) == 24 and fresh != request_id(b"") and request_id(b"\r\n ") != ""


@ASYNC
async def test_client_request_id_reaches_worker_and_feedback(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address]}, redis_url, gateway_feedback=True)
    ) as c:
        r = await c.post("/v1/chat/completions", json=chat("hello"), headers={"x-request-id": "client-42\n"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "client-42"
        assert r.json()["id"] == "chatcmpl-client-42"
        assert es[0].servicer.requests[-1].request_id == "client-42"
        r = await c.post("/v1/chat/completions", json={**chat("hello"), "stream": True},
                         headers={"x-request-id": "client-43"})
        assert r.headers["x-request-id"] == "client-43"
        assert es[0].servicer.requests[-1].request_id == "client-43"
        client = redis.Redis.from_url(redis_url)

        def gateway_ids() -> set[bytes]:
            return {f[b"request_id"] for _, f in client.xrange(FEEDBACK_STREAM) if f[b"engine"] == b"gateway"}

        t_end = time.monotonic() + 5
        while gateway_ids() != {b"client-42", b"client-43"}:
            assert time.monotonic() < t_end, gateway_ids()
            await asyncio.sleep(0.05)
        client.close()


def test_half_open_breaker_lets_one_trial_through(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    e = Endpoint("mtp", "127.0.0.1:1", breaker_failures=2, breaker_cooldown_s=5.0)
    e.healthy = True
    for _ in range(2):
        e.record_failure("boom")
    assert e.breaker_state == "open" and not e.available(now[0])
    now[0] += 5.0
    assert e.breaker_state == "half_open" and e.available(now[0])
    trial = e.acquire()
    assert trial and not e.available(now[0])  # everything else waits for the trial's outcome
    e.record_failure("still broken")
    e.release(trial)
    assert e.breaker_state == "open" and not e.available(now[0])
    now[0] += 5.0
    trial = e.acquire()
    assert trial and not e.available(now[0])
    e.release(trial)  # e.g. the client went away: no outcome, the next request is the trial
    assert e.available(now[0])
    trial = e.acquire()
    e.record_success()
    e.release(trial)
    assert e.breaker_state == "closed" and e.available(now[0])
    assert not e.acquire() and e.available(now[0])  # closed: no trial bookkeeping


def test_pools_sharing_workers_balance_on_every_pools_requests() -> None:
    """Two pools over the same two multi-mode workers: a request of one pool goes to the worker the
    other pool has left idle, not to the one it is busy with (each pool's own count is 0 on both)."""
    from router.workers.pools import PoolManager

    pm = PoolManager({"mtp": ["127.0.0.1:1", "127.0.0.1:2"], "dfly": ["127.0.0.1:1", "127.0.0.1:2"]},
                     modes={"mtp": "mtp", "dfly": "dfly"})
    for e in pm.endpoints():
        e.healthy = True
    busy = next(e for e in pm.pools["dfly"] if e.address == "127.0.0.1:1")
    trials = [busy.acquire() for _ in range(3)]        # three dfly requests on worker 1
    assert [pm.pick("mtp").address for _ in range(5)] == ["127.0.0.1:2"] * 5
    mtp_on_1 = next(e for e in pm.pools["mtp"] if e.address == "127.0.0.1:1")
    assert (mtp_on_1.inflight, mtp_on_1.worker.inflight) == (0, 3)   # its pool's own count, the worker's
    for t in trials:
        busy.release(t)
    assert mtp_on_1.worker.inflight == 0


@ASYNC
async def test_a_worker_back_from_an_outage_starts_with_a_closed_breaker() -> None:
    """A killed worker: its requests' connection failures open the breaker and its health checks fail;
    the first check that passes once it is back closes the breaker, so the restarted worker takes every
    request at once, not one half-open trial at a time. (Failed requests while the checks pass keep the
    breaker open: tests/router/test_faults.py.)"""
    worker = await FakeEngine(FakeConfig()).start()
    e = Endpoint("mtp", worker.address, breaker_failures=2, breaker_cooldown_s=60.0)
    e.connect()
    try:
        await e.check(2.0)
        assert e.healthy and e.available(time.monotonic())
        await worker.stop()   # kill -9
        for _ in range(2):
            e.record_failure("UNAVAILABLE", connection=True)
        await e.check(1.0)
        assert not e.healthy and e.breaker_state == "open"
        worker = await FakeEngine(FakeConfig(), port=worker.port).start()   # restarted on its port
        t0 = time.monotonic()
        while not e.healthy and time.monotonic() - t0 < 10:
            await e.check(1.0)
            await asyncio.sleep(0.05)
        assert e.healthy and e.breaker_state == "closed" and e.available(time.monotonic())
    finally:
        await e.close()
        await worker.stop()
