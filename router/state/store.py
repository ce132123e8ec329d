"""Policy and statistics in Redis (keys in docs/redis-layout.md), used only off the request path.

- `{specroute}:policy`: the current policy JSON (with `version`).
- `{specroute}:policy:versions`: list of history entries `{version, time, actor, action, diff, policy}`.
- `{specroute}:policy:shadow`: the shadow policy, if any (router/state/shadow.py; its submit and discard
  are audited in the history above, as `shadow: true` entries).
- `specroute:policy:events`: pub/sub channel (not a key); every write publishes the new document.
- `{specroute}:stats:v2:*`: decayed aggregates written by workers (specroute/contracts/feedback.py), read by
  router/state/stats.py.

The URL picks one Redis (`redis://`) or a Redis Cluster (`redis+cluster://`, specroute/redis_url.py); the
keys share the hash tag `{specroute}`, so the compare-and-set script's two keys sit in one slot.

Writes are compare-and-set in one Lua script (version check, SET, history append, PUBLISH), so
two admins racing cannot both win: the loser gets `VersionConflict` (HTTP 412).

The store's failures are domain errors (`StoreError` and its subclasses); the API layer
(router/http/errors.py) turns them into HTTP responses.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from router.routing.policy import Policy, diff_policies
from specroute.contracts.feedback import LEGACY_PREFIX, POLICY_KEY, PREFIX
from specroute.redis_url import connect

VERSIONS_KEY = PREFIX + "policy:versions"
EVENTS_CHANNEL = LEGACY_PREFIX + "policy:events"   # a channel, not a key: a cluster's PUBLISH reaches every node
MAX_HISTORY = 500

_CAS_LUA = """
local cur = redis.call('GET', KEYS[1])
local v = 0
if cur then
  local ok, d = pcall(cjson.decode, cur)
  if ok and type(d) == 'table' and tonumber(d['version']) then v = tonumber(d['version']) end
end
if v ~= tonumber(ARGV[1]) then return {0, v} end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
redis.call('PUBLISH', ARGV[4], ARGV[2])
return {1, v + 1}
"""


class StoreError(Exception):
    """A policy-store operation that could not be done (mapped to an HTTP error by the API layer)."""


class StoreUnavailable(StoreError):
    """Redis failed (down, timed out, or answered garbage) during a policy-store operation."""

    def __init__(self, cause: BaseException | str) -> None:
        super().__init__(f"policy store unavailable: {cause}")


class StoreNotConfigured(StoreUnavailable):
    """The gateway runs without Redis, so there is nothing to write to."""

    def __init__(self) -> None:
        StoreError.__init__(self, "no policy store configured (set SPECROUTE_REDIS_URL)")


class VersionConflict(StoreError):
    """The stored policy is at version `current`, not the `expected` one the write was based on."""

    def __init__(self, current: int, expected: int | None = None) -> None:
        super().__init__(f"policy changed meanwhile: current version is {current}, If-Match was {expected}")
        self.current = current
        self.expected = expected


def dump_policy(p: Policy) -> bytes:
    return orjson.dumps(p.model_dump(mode="json"))


def parse_policy(raw: bytes | str | None) -> Policy | None:
    if raw is None:
        return None
    return Policy.model_validate(orjson.loads(raw))


class PolicyStore:
    def __init__(self, url: str, timeout_s: float = 0.5) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.client = connect(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )
        self._cas = self.client.register_script(_CAS_LUA)

    async def close(self) -> None:
        await self.client.aclose()

    def pubsub_client(self) -> Any:
        """A separate connection for SUBSCRIBE (blocking reads, no socket read timeout)."""
        return connect(
            self.url, socket_timeout=None, socket_connect_timeout=self.timeout_s, retry=Retry(NoBackoff(), 0),
            health_check_interval=5,
        )

    async def get(self) -> Policy | None:
        return parse_policy(await self.client.get(POLICY_KEY))

    async def put(
        self,
        new: Policy,
        expected_version: int,
        actor: str,
        action: str = "put",
        note: str = "",
        old: Policy | None = None,
        audit: Mapping[str, Any] | None = None,
    ) -> Policy:
        """Write `new` as version `expected_version + 1` if the current version is `expected_version`
        (`audit`: extra fields of the history entry, e.g. that the write was forced)."""
        doc = new.model_copy(update={"version": expected_version + 1})
        data = doc.model_dump(mode="json")
        entry = {
            "version": doc.version,
            "time": time.time(),
            "actor": actor,
            "action": action,
            "note": note,
            "diff": diff_policies(old.model_dump(mode="json") if old is not None else None, data),
            "policy": data,
            **(audit or {}),
        }
        ok, current = await self._cas(
            keys=[POLICY_KEY, VERSIONS_KEY],
            args=[expected_version, orjson.dumps(data), orjson.dumps(entry), EVENTS_CHANNEL, MAX_HISTORY],
        )
        if not int(ok):
            raise VersionConflict(int(current), expected_version)
        return doc

    async def init(self, default: Policy) -> Policy:
        """The stored policy, or `default` written as version 1 when there is none."""
        cur = await self.get()
        if cur is not None:
            return cur
        try:
            return await self.put(default, 0, actor="gateway", action="init")
        except VersionConflict:
            got = await self.get()
            assert got is not None
            return got

    async def versions(self, limit: int = 50) -> list[dict[str, Any]]:
        raw = await self.client.lrange(VERSIONS_KEY, -limit, -1)
        return [orjson.loads(r) for r in reversed(raw)]

    async def version(self, v: int) -> dict[str, Any] | None:
        for entry in await self.versions(MAX_HISTORY):
            if not entry.get("shadow") and int(entry.get("version", -1)) == v:
                return entry
        return None

    async def pull(self) -> Policy | None:
        """The current policy document (None when Redis holds none)."""
        return parse_policy(await self.client.get(POLICY_KEY))
