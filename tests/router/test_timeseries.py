"""The dashboard's time series (router/observability/timeseries.py): the pure merge of samples, and every gateway
replica serving the same picture from Redis."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.observability.timeseries import BUCKETS_MS, SeriesSampler, aggregate, percentile
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
CODE = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 4}


def test_samples_of_two_gateways_merge_into_one_picture() -> None:
    mal = {("code", "dfly"): 3.5}
    a = SeriesSampler(None, 5.0, 3600.0, lambda: mal, lambda e: None, gateway_id="a")
    b = SeriesSampler(None, 5.0, 3600.0, lambda: mal, lambda e: None, gateway_id="b")
    for _ in range(3):
        a.observe("code", "dfly", 200, 10, 0.004)
    a.observe("code", "mtp", 200, 10, 0.004)
    b.observe("chat", "mtp", 503, 0, 0.5)
    out = aggregate([a.take(100.0), b.take(101.0)], 10.0)
    assert out["t"] == [100.0] and out["requests_per_s"] == [0.5] and out["goodput_tps"] == [4.0]
    assert out["errors_per_s"] == [0.1]
    assert out["shares"] == {"chat": {"mtp": [1.0]}, "code": {"dfly": [0.75], "mtp": [0.25]}}
    assert out["mal"] == {"code/dfly": [3.5]}
    assert out["p50_ms"] == [5.0] and out["p99_ms"] == [500.0]
    assert a.take(110.0)["req"] == []  # each sample counts its own interval
    assert percentile([0] * (len(BUCKETS_MS) + 1), 0.5) is None


@pytest.mark.asyncio(loop_scope="session")
async def test_every_replica_draws_the_same_picture(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es:
        s = settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, timeseries_interval_s=0.2)
        async with running_app(s) as c1, running_app(s) as c2:
            for _ in range(3):
                assert (await c1.post("/v1/chat/completions", json=CODE)).status_code == 200
            assert (await c2.post("/v1/chat/completions", json=CHAT)).status_code == 200
            t_end = time.monotonic() + 5
            while True:
                views = [(await c.get("/admin/timeseries?window=60", headers=ADMIN)).json() for c in (c1, c2)]
                if all(sum(v["requests_per_s"]) * v["step_s"] >= 4 for v in views):
                    break
                assert time.monotonic() < t_end, views
                await asyncio.sleep(0.1)
            v = views[0]
            assert round(sum(v["requests_per_s"]) * v["step_s"]) == 4
            assert round(sum(v["goodput_tps"]) * v["step_s"]) == 16
            assert set(v["shares"]) == {"chat", "code"} and any(x is not None for x in v["p50_ms"])
            assert [round(sum(x["requests_per_s"]) * x["step_s"]) for x in views] == [4, 4]  # the same on both
            assert (await c1.get("/admin/timeseries", headers={"authorization": "Bearer x"})).status_code == 401
