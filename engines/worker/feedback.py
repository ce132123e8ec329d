"""Per-request feedback to Redis, off the decode thread.

Finished requests are put on a bounded asyncio queue; one background task writes each record with
the shared atomic script (`specroute.contracts.feedback.make_recorder`: XADD to `specroute:feedback` + decayed
`specroute:stats:{domain}:{pool}` update). Redis down or the queue full means the record is dropped
and counted (`specroute_redis_errors_total`), never a failed request and never a stalled stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from specroute.contracts.feedback import FeedbackRecord, make_recorder

log = logging.getLogger("specroute.worker.feedback")


class FeedbackWriter:
    def __init__(self, url: str | None, on_error=None, on_written=None, maxsize: int = 1000,
                 retry_after_s: float = 2.0) -> None:
        self.url = url
        self.queue: asyncio.Queue[FeedbackRecord] = asyncio.Queue(maxsize)
        self.on_error = on_error or (lambda: None)
        self.on_written = on_written or (lambda: None)
        self.retry_after_s = retry_after_s
        self._task: asyncio.Task | None = None
        self._client = None
        self._record = None
        self._down_until = 0.0
        self.written = 0
        self.errors = 0

    def start(self) -> None:
        if self.url and self._task is None:
            import redis.asyncio as aioredis

            self._client = aioredis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
            self._record = make_recorder(self._client)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="specroute-feedback")

    def put(self, rec: FeedbackRecord) -> None:
        if self._task is None:
            return
        try:
            self.queue.put_nowait(rec)
        except asyncio.QueueFull:
            self._error()

    def _error(self) -> None:
        self.errors += 1
        self.on_error()

    async def _run(self) -> None:
        assert self._record is not None
        while True:
            rec = await self.queue.get()
            if time.monotonic() < self._down_until:   # recently down: drop fast, don't pile up waits
                self._error()
                continue
            try:
                await self._record(rec)
                self.written += 1
                self.on_written()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._down_until = time.monotonic() + self.retry_after_s
                self._error()
                log.warning("feedback to Redis lost: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    async def flush(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.queue.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self._task is not None:
            await self.flush()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
