"""Shutdown is deterministic: every background task of the gateway (policy pub/sub listener, stats
refresh, feedback writer, pool health/Load poller) is stopped and awaited when the app's lifespan
ends, even when a library swallows the cancellation (Python 3.11's `asyncio.wait_for`, used by
redis-py for every command, can do that; it used to hang the lifespan exit)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import redis

from router.tasks import stop_tasks
from specroute.contracts.feedback import POLICY_KEY
from tests.router.conftest import running_app, settings_for
from tests.router.fake_engine import FakeConfig, FakeEngine

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(60)]


async def _stubborn(swallow: int, stop: asyncio.Event) -> None:
    """Loses its first `swallow` cancellations, like a library that drops a CancelledError."""
    lost = 0
    while not stop.is_set():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if lost >= swallow:
                raise
            lost += 1


async def test_stop_tasks_recancels_until_the_task_ends() -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_stubborn(n, stop), name=f"stubborn-{n}") for n in (0, 1, 3)]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    left = await stop_tasks(tasks)
    assert left == [] and all(t.cancelled() for t in tasks)
    assert time.perf_counter() - t0 < 1.0


async def test_stop_tasks_is_bounded() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(_stubborn(10**9, stop), name="never-stops")
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    left = await stop_tasks([task], timeout_s=0.2)
    assert left == [task] and 0.15 < time.perf_counter() - t0 < 2.0
    stop.set()
    task.cancel()  # swallowed: the loop ends through its stop flag
    await asyncio.wait([task], timeout=5)
    assert task.done()


async def test_lifespan_exit_survives_a_swallowed_cancellation(redis_url: str) -> None:
    es = await FakeEngine(FakeConfig()).start()
    try:
        entered = asyncio.Event()
        calls = 0
        async with running_app(settings_for({"mtp": [es.address]}, redis_url)) as c:
            gw = c.app.state.gateway  # type: ignore[attr-defined]
            orig_pull = gw.store.pull

            async def lossy_pull() -> Any:
                nonlocal calls
                calls += 1
                entered.set()
                # the cancellation is lost here, as in asyncio.wait_for on Python 3.11
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(3600)
                return await orig_pull()

            gw.store.pull = lossy_pull
            await asyncio.wait_for(entered.wait(), 5)
            tasks = [*gw._tasks, gw.pools._task]
            t0 = time.perf_counter()
        # the lifespan exit has returned: everything is stopped, nothing runs on
        assert time.perf_counter() - t0 < 3.0
        assert all(t.done() for t in tasks)
        assert calls == 1
        r = redis.Redis.from_url(redis_url)
        r.flushall()
        await asyncio.sleep(0.3)  # a surviving refresh loop would re-seed the policy (every 0.1 s)
        assert r.get(POLICY_KEY) is None
        assert all(e.channel is None for e in gw.pools.endpoints())
    finally:
        await es.stop()
