"""Per-key requests-per-minute and tokens-per-minute limits, kept in Redis so that every gateway
replica counts the same traffic.

A sliding-window counter per key and minute: the estimate is `previous * (1 - elapsed) + current`
(elapsed as a fraction of the current minute), checked and counted atomically in one Lua script on
Redis' own clock (`ADMIT_LUA`). A request is admitted while the request estimate stays within `rpm`
and the token estimate plus its reservation stays within `tpm`. The reservation (the prompt's
estimate plus `max_tokens`, at most `tpm`) is charged at admission, so concurrent long requests
cannot overshoot; at completion the difference to the real count (prompt + completion tokens, which
may be negative) goes to the minute of the reservation (`CHARGE_LUA`, off the response path).

Each key's counters are one Redis hash, `specroute:rl:{name}` (fields `r:<minute>`, `t:<minute>`),
the only key the scripts touch, declared in `KEYS` and hash-tagged: Redis Cluster routes it like any
other key. It lives two minutes after its last write; fields older than the previous minute are
dropped as the minutes pass.

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

# KEYS[1] the key's counters (a hash); ARGV[1] rpm (0: none), ARGV[2] tpm (0: none), ARGV[3] tokens to
# reserve; returns {admitted (0/1), retry_after_s, which limit ('rpm'/'tpm'/''), minute, tokens reserved}
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local w = math.floor(now / 60)
local frac = (now - w * 60) / 60
local h = KEYS[1]
local function est(kind)
  local cur = tonumber(redis.call('HGET', h, kind .. w) or '0')
  local prev = tonumber(redis.call('HGET', h, kind .. (w - 1)) or '0')
  return prev * (1 - frac) + cur
end
local retry = math.max(1, math.ceil((1 - frac) * 60))
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local reserve = 0
if tpm > 0 then
  reserve = math.min(tonumber(ARGV[3]), tpm)
  if est('t:') + reserve > tpm then return {0, retry, 'tpm', w, 0} end
end
if rpm > 0 then
  if est('r:') + 1 > rpm then return {0, retry, 'rpm', w, 0} end
end
redis.call('HINCRBY', h, 'r:' .. w, 1)
if reserve > 0 then redis.call('HINCRBY', h, 't:' .. w, reserve) end
redis.call('HDEL', h, 'r:' .. (w - 2), 't:' .. (w - 2), 'r:' .. (w - 3), 't:' .. (w - 3))
redis.call('EXPIRE', h, 130)
return {1, 0, '', w, reserve}
"""

# KEYS[1] the key's counters; ARGV[1] tokens to add (negative: a refund), ARGV[2] the reservation's minute
CHARGE_LUA = """
local t = redis.call('TIME')
local w = tonumber(ARGV[2])
if w < math.floor(tonumber(t[1]) / 60) - 1 then return 0 end
redis.call('HINCRBY', KEYS[1], 't:' .. w, ARGV[1])
redis.call('EXPIRE', KEYS[1], 130)
return 1
"""


def counters_key(name: str) -> str:
    """The Redis key of `name`'s counters, hash-tagged with the name."""
    return f"{PREFIX}{{{name}}}"


FAILURES = (TimeoutError, RedisError, OSError)


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    retry_after_s: int = 0
    limit: str = ""  # "rpm" or "tpm" when refused
    minute: int = 0  # the minute the tokens were reserved in
    reserved: int = 0  # tokens reserved (0: none)


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

    async def admit(self, key: ApiKey, reserve: int = 0) -> Verdict:
        """One atomic check-and-count for `key` (which has a limit), reserving `reserve` tokens against
        its tpm; fails open."""
        lim = key.limits
        if self._admit is None:
            return ADMITTED  # no Redis configured: nothing to count in
        if time.monotonic() < self._skip_until:
            self.metrics.rate_limit_fail_open.inc()
            return ADMITTED
        try:
            ok, retry, which, minute, reserved = await self._admit(
                keys=[counters_key(key.name)], args=[lim.rpm or 0, lim.tpm or 0, max(0, reserve)])
        except FAILURES as exc:
            self._failed(exc)
            return ADMITTED
        if int(ok):
            return Verdict(True, minute=int(minute), reserved=int(reserved))
        which = which.decode() if isinstance(which, bytes) else str(which)
        self.metrics.rate_limited_by(self.metrics.key_label(key.name), which).inc()
        return Verdict(False, int(retry), which)

    def charge(self, key: ApiKey, tokens: int, verdict: Verdict) -> None:
        """Settle a finished request's `tokens` against what `verdict` reserved, in the reservation's
        minute (in the background; fails open)."""
        delta = tokens - verdict.reserved
        if self._charge is None or key.limits.tpm is None or delta == 0 or time.monotonic() < self._skip_until:
            return
        minute = verdict.minute or int(time.time() // 60)
        task = asyncio.get_running_loop().create_task(self._do_charge(key.name, delta, minute))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _do_charge(self, name: str, tokens: int, minute: int) -> None:
        try:
            await self._charge(keys=[counters_key(name)], args=[tokens, minute])
        except FAILURES as exc:
            self._failed(exc)

    async def close(self) -> None:
        for t in list(self._pending):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(t, 1.0)
