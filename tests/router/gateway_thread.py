"""A gateway (real uvicorn) plus fake engine workers running on their own event loop in a background
thread, for synchronous test clients (schemathesis, requests)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from router.settings import Settings
from tests.router.conftest import engines, uvicorn_app
from tests.router.fake_engine import FakeConfig


class GatewayThread:
    def __init__(self, make_settings: Any, cfgs: list[FakeConfig]) -> None:
        self.make_settings = make_settings
        self.cfgs = cfgs
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with engines(*self.cfgs) as es:
            settings: Settings = self.make_settings([e.address for e in es])
            async with uvicorn_app(settings) as (url, _app):
                self.url = url
                self._ready.set()
                await self._stop.wait()

    def start(self) -> GatewayThread:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
