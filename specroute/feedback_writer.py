"""The one feedback writer both wings use: workers write a record per finished request, and a gateway
with `--gateway-feedback` writes one per request it served (for workers that write none).

Records go on a bounded asyncio queue (full = dropped and counted, never a slower request); one
background task writes each with the shared atomic script (`specroute.contracts.feedback.make_recorder`).
Redis down: the record is dropped and counted, and for `retry_after_s` further records are dropped at
once instead of each waiting on a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from specroute.contracts.feedback import FeedbackRecord, make_recorder

log = logging.getLogger("specroute.feedback")


def _nothing(_exc: BaseException | None = None) -> None:
    return None


class FeedbackWriter:
    """`put` from the request path, `start` / `close` around the event loop's life. `client`: an
    asyncio Redis client (closed by `close` only when `owns_client`); `on_error(exc or None)` for each
    dropped record (None: the queue was full), `on_written()` for each written one."""

    def __init__(self, client: Any, *, on_error: Callable[[BaseException | None], None] = _nothing,
                 on_written: Callable[[], None] = lambda: None, maxsize: int = 10_000,
                 retry_after_s: float = 2.0, owns_client: bool = False) -> None:
        self.client = client
        self.queue: asyncio.Queue[FeedbackRecord] = asyncio.Queue(maxsize)
        self.on_error, self.on_written = on_error, on_written
        self.retry_after_s = retry_after_s
        self.owns_client = owns_client
        self.written = self.errors = 0
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> FeedbackWriter:
        from specroute.redis_url import connect

        client = connect(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        return cls(client, owns_client=True, **kw)

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="specroute-feedback")
        return self._task

    def put(self, rec: FeedbackRecord) -> None:
        if self._task is None:
            return
        try:
            self.queue.put_nowait(rec)
        except asyncio.QueueFull:
            self._dropped(None)

    def _dropped(self, exc: BaseException | None) -> None:
        self.errors += 1
        self.on_error(exc)

    async def _run(self) -> None:
        record = make_recorder(self.client)
        while True:
            rec = await self.queue.get()
            if time.monotonic() < self._down_until:
                self._dropped(None)
                continue
            try:
                await record(rec)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._down_until = time.monotonic() + self.retry_after_s
                self._dropped(exc)
                log.warning("feedback to Redis lost: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            else:
                self.written += 1
                self.on_written()

    async def flush(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.queue.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Write what is queued (bounded), stop the task, close an owned client."""
        if self._task is not None:
            await self.flush()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self.owns_client:
            with contextlib.suppress(Exception):
                await self.client.aclose()
