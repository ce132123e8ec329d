"""Background-task shutdown that cannot hang on a lost cancellation.

A single `Task.cancel()` is not enough to stop a `while True` loop reliably on Python 3.11:
`asyncio.wait_for` there returns the inner result instead of raising `CancelledError` when the
cancellation and the inner completion land in the same event-loop iteration (fixed in 3.12,
CPython gh-86296), and redis-py wraps every command it sends in `asyncio.wait_for` when a socket
timeout is set. The cancellation is then silently dropped, the loop goes round again, and a
shutdown that awaits the task waits forever (this hung the gateway's lifespan exit in tests).

So every background loop also checks an explicit stop flag (`run_every` does it for the periodic
ones), and `stop_tasks` re-sends the cancellation until each task has really finished (bounded by a
timeout, never an endless wait).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger("specroute.gateway.tasks")


async def stop_tasks(
    tasks: Iterable[asyncio.Task[None]], *, timeout_s: float = 5.0, recancel_s: float = 0.05
) -> list[asyncio.Task[None]]:
    """Cancel `tasks` and wait until all have finished, re-cancelling every `recancel_s` any task
    whose cancellation was swallowed. Returns the tasks still running after `timeout_s` (logged)."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    for t in pending:
        t.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        left = deadline - loop.time()
        if left <= 0:
            log.error("background tasks did not stop within %.1f s: %s", timeout_s,
                      ", ".join(sorted(t.get_name() for t in pending)))
            break
        _, pending = await asyncio.wait(pending, timeout=min(recancel_s, left))
        for t in pending:
            t.cancel()
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            log.error("background task %s failed", t.get_name(), exc_info=t.exception())
    return list(pending)


async def run_every(interval_s: float, step: Callable[[], Awaitable[None]], stopped: Callable[[], bool],
                    what: str) -> None:
    """Await `step()` every `interval_s` seconds until `stopped()`; a failed step is logged and the
    loop goes on (a background loop must never die of one error)."""
    while not stopped():
        await asyncio.sleep(interval_s)
        if stopped():
            return
        try:
            await step()
        except Exception:  # pragma: no cover - never let the loop die
            log.exception("%s", what)
