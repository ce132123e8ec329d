"""Per-key requests-per-minute and tokens-per-minute limits, kept in Redis so that every gateway
replica counts the same traffic.

A sliding-window counter per key and minute: the estimate is `previous * (1 - elapsed) + current`
(elapsed as a fraction of the current minute), checked and incremented atomically in one Lua script
on Redis' own clock (`ADMIT_LUA`). A request is admitted while the request estimate stays within
`rpm` and the token estimate is below `tpm`; its tokens (prompt + completion) are added when it
finishes (`CHARGE_LUA`, off the response path). Keys live for two minutes
(`specroute:rl:{name}:{r|t}:{minute}`).

Redis down or slow: the request is admitted (fail open) and counted in
`specroute_rate_limit_fail_open_total`; after a failure the limiter does not try Redis again for
`backoff_s`, so an outage costs no request a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from router.keys.ring import ApiKey
from router.observability.metrics import Metrics
from router.state.store import PolicyStore

log = logging.getLogger("specroute.gateway.ratelimit")

PREFIX = "specroute:rl:"
WINDOW_S = 60

# KEYS[1] prefix of the key's counters; ARGV[1] rpm (0: none), ARGV[2] tpm (0: none)
# returns {admitted (0/1), retry_after_s, which limit ('rpm'/'tpm'/'')}
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local w = math.floor(now / 60)
local frac = (now - w * 60) / 60
local base = KEYS[1]
local function est(kind)
  local cur = tonumber(redis.call('GET', base .. kind .. w) or '0')
  local prev = tonumber(redis.call('GET', base .. kind .. (w - 1)) or '0')
  return prev * (1 - frac) + cur, prev
end
local retry = math.max(1, math.ceil((1 - frac) * 60))
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
if tpm > 0 then
  local tok = est(':t:')
  if tok >= tpm then return {0, retry, 'tpm'} end
end
if rpm > 0 then
  local req = est(':r:')
  if req + 1 > rpm then return {0, retry, 'rpm'} end
end
local k = base .. ':r:' .. w
redis.call('INCR', k)
redis.call('EXPIRE', k, 130)
return {1, 0, ''}
"""

# KEYS[1] prefix of the key's counters; ARGV[1] tokens to add
CHARGE_LUA = """
local t = redis.call('TIME')
local k = KEYS[1] .. ':t:' .. math.floor(tonumber(t[1]) / 60)
redis.call('INCRBY', k, ARGV[1])
redis.call('EXPIRE', k, 130)
return 1
"""

FAILURES = (TimeoutError, RedisError, OSError)


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    retry_after_s: int = 0
    limit: str = ""  # "rpm" or "tpm" when refused


ADMITTED = Verdict(True)


class RateLimiter:
    def __init__(self, store: PolicyStore | None, metrics: Metrics, backoff_s: float = 1.0) -> None:
        self.store = store
        self.metrics = metrics
        self.backoff_s = backoff_s
        self._skip_until = 0.0
        self._admit = store.client.register_script(ADMIT_LUA) if store is not None else None
        self._charge = store.client.register_script(CHARGE_LUA) if store is not None else None
        self._pending: set[asyncio.Task[None]] = set()

    def _failed(self, exc: BaseException) -> None:
        self.metrics.rate_limit_fail_open.inc()
        self.metrics.redis_errors.inc()
        if time.monotonic() >= self._skip_until:
            log.warning("rate limiter: redis unavailable, admitting requests unlimited: %s", exc)
        self._skip_until = time.monotonic() + self.backoff_s

    async def admit(self, key: ApiKey) -> Verdict:
        """One atomic check-and-count for `key` (which has a limit); fails open."""
        lim = key.limits
        if self._admit is None:
            return ADMITTED  # no Redis configured: nothing to count in
        if time.monotonic() < self._skip_until:
            self.metrics.rate_limit_fail_open.inc()
            return ADMITTED
        try:
            ok, retry, which = await self._admit(keys=[PREFIX + key.name], args=[lim.rpm or 0, lim.tpm or 0])
        except FAILURES as exc:
            self._failed(exc)
            return ADMITTED
        if int(ok):
            return ADMITTED
        which = which.decode() if isinstance(which, bytes) else str(which)
        self.metrics.rate_limited_by(key.name, which).inc()
        return Verdict(False, int(retry), which)

    def charge(self, key: ApiKey, tokens: int) -> None:
        """Add a finished request's tokens to `key`'s minute (in the background; fails open)."""
        if self._charge is None or key.limits.tpm is None or tokens <= 0 or time.monotonic() < self._skip_until:
            return
        task = asyncio.get_running_loop().create_task(self._do_charge(key.name, tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _do_charge(self, name: str, tokens: int) -> None:
        try:
            await self._charge(keys=[PREFIX + name], args=[tokens])
        except FAILURES as exc:
            self._failed(exc)

    async def close(self) -> None:
        for t in list(self._pending):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(t, 1.0)
