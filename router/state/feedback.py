"""`--gateway-feedback`: the gateway writes the acceptance feedback of the requests it served, for
workers that do not write their own (e.g. the vLLM adapter without Redis).

Records go on a bounded queue (full = dropped, never a slower request); one background task writes
them with the shared script (`specroute.contracts.feedback.make_recorder`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from router.state.snapshot import REDIS_FAILURES
from router.state.store import PolicyStore
from specroute.contracts.feedback import FeedbackRecord, make_recorder


class GatewayFeedback:
    def __init__(self, store: PolicyStore, on_error: Callable[[BaseException], None],
                 maxsize: int = 10_000) -> None:
        self.store = store
        self.on_error = on_error
        self.queue: asyncio.Queue[FeedbackRecord] = asyncio.Queue(maxsize=maxsize)
        self.closing = False

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._loop(), name="specroute-feedback")

    def put(self, rec: FeedbackRecord) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(rec)

    async def _loop(self) -> None:
        record = make_recorder(self.store.client)
        while not self.closing:
            rec = await self.queue.get()
            try:
                await record(rec)
            except REDIS_FAILURES as exc:
                self.on_error(exc)
