"""Stored responses of `/v1/responses` (for `previous_response_id` and `GET /v1/responses/{id}`).

In Redis (`specroute:response:<id>`, JSON, expiring after `ttl_s`), so every gateway of a deployment
sees every response; without Redis, in this process (at most `max_local`, the oldest dropped first),
expiring alike. A Redis failure is `StoreUnavailable` (the API answers 503).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import orjson
import redis.asyncio as aredis
from redis.exceptions import RedisError

from router.state.store import StoreUnavailable

PREFIX = "specroute:response:"


class ResponseStore:
    def __init__(self, client: aredis.Redis | None, ttl_s: float, max_local: int = 10_000) -> None:
        self.client, self.ttl_s, self.max_local = client, ttl_s, max_local
        self._local: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    async def put(self, response_id: str, record: dict[str, Any]) -> None:
        data = orjson.dumps(record)
        if self.client is None:
            self._local[response_id] = (time.monotonic() + self.ttl_s, data)
            self._local.move_to_end(response_id)
            while len(self._local) > self.max_local:
                self._local.popitem(last=False)
            return
        try:
            await self.client.set(PREFIX + response_id, data, px=max(1, int(self.ttl_s * 1000)))
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(exc) from exc

    async def get(self, response_id: str) -> dict[str, Any] | None:
        """The stored record, or None (unknown or expired)."""
        if self.client is None:
            hit = self._local.get(response_id)
            if hit is None or hit[0] < time.monotonic():
                self._local.pop(response_id, None)
                return None
            return orjson.loads(hit[1])   # type: ignore[no-any-return]
        try:
            raw = await self.client.get(PREFIX + response_id)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(exc) from exc
        return orjson.loads(raw) if raw is not None else None   # type: ignore[no-any-return]
