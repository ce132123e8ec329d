"""Which pool and worker served each conversation, kept in Redis with a TTL, and each pool's observed
prefill cost per prompt token: the state the conversation rule (router/routing/conversation.py) reads.

- `{specroute}:conv:<key>`: `{"pool", "worker"}` of the conversation's last turn, expiring `ttl_s` after
  it (every turn renews it). Every gateway reads and writes the same keys, so a conversation keeps
  its worker whichever gateway its turns reach.

A lookup is one GET (only for requests that carry a conversation: a header, `user`, or a history with
an assistant turn), bounded by the store's timeout; a failure means no affinity for that turn, never
an error. Writes go out in the background after the turn is served (the turns that finish together in
one pipeline); until its write has landed, a gateway answers lookups of a key it wrote from memory, so
a conversation's next turn sees its last one however soon it arrives (read your own writes). Without
Redis the same map is kept in this process (bounded, oldest first out).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import orjson
import redis.asyncio as aredis

from router.routing.conversation import Sticky
from specroute.contracts.feedback import PREFIX

KEY_PREFIX = PREFIX + "conv:"
LOCAL_MAX = 10_000
WRITE_BATCH = 256
log = logging.getLogger("specroute.gateway.conversations")


class PrefillCost:
    """Each pool's prefill time per prompt token, an exponential average of what its workers took to
    the first token over the prompt's tokens (`alpha` the weight of the newest)."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.ms_per_token: dict[str, float] = {}

    def observe(self, pool: str, ttft_s: float, prompt_tokens: int) -> None:
        if prompt_tokens <= 0 or ttft_s <= 0:
            return
        x = ttft_s * 1000.0 / prompt_tokens
        old = self.ms_per_token.get(pool)
        self.ms_per_token[pool] = x if old is None else old + self.alpha * (x - old)


class Conversations:
    """The conversation -> (pool, worker) map (module docstring)."""

    def __init__(self, client: aredis.Redis | None, ttl_s: float,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.client, self.ttl_s, self.on_error = client, ttl_s, on_error
        self.local: OrderedDict[str, tuple[float, Sticky]] = OrderedDict()
        self.prefill = PrefillCost()
        self._queue: list[tuple[str, bytes]] = []   # (Redis key, value) not written yet
        self._unwritten: dict[str, Sticky] = {}       # key -> the value queued or in flight for it
        self._writer: asyncio.Task[None] | None = None

    async def lookup(self, key: str) -> Sticky | None:
        if self.client is None:
            hit = self.local.get(key)
            if hit is None or hit[0] < time.monotonic():
                return None
            return hit[1]
        if (mine := self._unwritten.get(key)) is not None:
            return mine
        try:
            raw = await self.client.get(KEY_PREFIX + key)
        except Exception as exc:  # Redis down or slow: no affinity for this turn
            self._failed(exc)
            return None
        if raw is None:
            return None
        try:
            d = orjson.loads(raw)
            return Sticky(str(d["pool"]), str(d["worker"]))
        except (ValueError, KeyError, TypeError):
            return None

    def remember(self, keys: list[str], where: Sticky) -> None:
        """Record that `where` served the conversation known by `keys` (written in the background, the
        turns that finish together in one pipeline)."""
        if not keys:
            return
        if self.client is None:
            until = time.monotonic() + self.ttl_s
            for k in keys:
                self.local.pop(k, None)
                self.local[k] = (until, where)
            while len(self.local) > LOCAL_MAX:
                self.local.popitem(last=False)
            return
        value = orjson.dumps({"pool": where.pool, "worker": where.worker})
        self._queue.extend((KEY_PREFIX + k, value) for k in keys)
        self._unwritten.update((k, where) for k in keys)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        assert self.client is not None
        await asyncio.sleep(0)   # the turns finishing now join this batch
        ttl = max(1, int(self.ttl_s))
        while self._queue:
            batch, self._queue = self._queue[:WRITE_BATCH], self._queue[WRITE_BATCH:]
            try:
                async with self.client.pipeline(transaction=False) as pipe:
                    for k, v in batch:
                        pipe.set(k, v, ex=ttl)
                    await pipe.execute()
            except Exception as exc:
                self._failed(exc)
            queued = {k for k, _ in self._queue}
            for k, _ in batch:   # landed (or lost with Redis): Redis answers from now on
                if k not in queued:
                    self._unwritten.pop(k[len(KEY_PREFIX):], None)

    async def flush(self) -> None:
        """Wait for the writes queued so far (shutdown, tests)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)

    def _failed(self, exc: BaseException) -> None:
        log.debug("conversation state: %s", exc)
        if self.on_error is not None:
            self.on_error(exc)
