"""The gateway's keys at run time: the `KeyRing` the request path reads (router/keys/ring.py), kept in
step with Redis (`{specroute}:keys`) by a background pull every `interval_s`, and the admin writes
(put, delete), each recorded in the audit log (`{specroute}:audit`, newest last, capped) in the same
transaction. The request path never awaits Redis for a key; only the rate limiter
(router/keys/ratelimit.py) does, for keys that have a limit.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError

from router.keys.ratelimit import FAILURES, RateLimiter
from router.keys.ring import (
    AUDIT_KEY,
    EMPTY,
    HASH_SECRET_KEY,
    KEYS_KEY,
    KeyLimits,
    KeyRing,
    KeyWrite,
    StoredKey,
    build_ring,
    secret_hash,
)
from router.observability.metrics import Metrics
from router.state.store import PolicyStore, StoreNotConfigured, StoreUnavailable
from router.tasks import run_every
from specroute.redis_url import migrate_legacy_names

log = logging.getLogger("specroute.gateway.keys")
MAX_AUDIT = 1000


class KeyManager:
    def __init__(self, static_secrets: Mapping[str, str], static_limits: Mapping[str, KeyLimits],
                 store: PolicyStore | None, metrics: Metrics, interval_s: float,
                 hash_secret: str | None = None) -> None:
        self.static_secrets = dict(static_secrets)
        # the key secrets' HMAC key: the operator's, else (once Redis answers) the one the gateways share
        # in Redis; until then a random one, which matches only this process' static keys
        self.hash_key = hash_secret.encode("utf-8") if hash_secret else secrets.token_bytes(32)
        self.hash_key_shared = bool(hash_secret) or store is None
        self.names_migrated = False   # `migrate_legacy_names` has run against the store
        self.static_limits = dict(static_limits)
        self.store = store
        self.metrics = metrics
        self.interval_s = interval_s
        self.stored: dict[str, StoredKey] = {}
        self.ring: KeyRing = EMPTY
        self.limiter = RateLimiter(store, metrics)
        self.closing = False
        self._rebuild()
        limited = sorted(k.name for k in self.ring.keys.values() if k.limited)
        if limited and store is None:
            log.warning("keys %s have rate limits but there is no Redis (SPECROUTE_REDIS_URL): not enforced",
                        ", ".join(limited))

    def _rebuild(self) -> None:
        self.ring = build_ring(self.static_secrets, self.static_limits, self.stored, self.hash_key)

    # -- sync ------------------------------------------------------------------------------------
    async def start(self) -> list[asyncio.Task[None]]:
        if self.store is None:
            return []
        await self._pull_step()
        loop = run_every(self.interval_s, self._pull_step, lambda: self.closing, "key refresh loop")
        return [asyncio.create_task(loop, name="specroute-keys")]

    async def pull(self) -> None:
        assert self.store is not None
        if not self.names_migrated:
            # before the first read or write under the tagged names: a gateway that started while Redis
            # was down must not create a fresh secret beside the one stored under the old name
            await migrate_legacy_names(self.store.client)
            self.names_migrated = True
        if not self.hash_key_shared:
            await self.store.client.set(HASH_SECRET_KEY, secrets.token_hex(32), nx=True)
            shared = await self.store.client.get(HASH_SECRET_KEY)
            self.hash_key = shared if isinstance(shared, bytes) else str(shared).encode()
            self.hash_key_shared = True
            self._rebuild()
        raw = await self.store.client.hgetall(KEYS_KEY)
        stored: dict[str, StoredKey] = {}
        for k, v in raw.items():
            name = k.decode() if isinstance(k, bytes) else str(k)
            try:
                stored[name] = StoredKey.model_validate(orjson.loads(v))
            except (ValidationError, orjson.JSONDecodeError) as exc:
                log.error("ignoring invalid stored key %r: %s", name, exc)
        if stored != self.stored:
            self.stored = stored
            self._rebuild()

    async def _pull_step(self) -> None:
        try:
            await self.pull()
        except FAILURES:
            self.metrics.redis_errors.inc()  # keep the last ring; the policy refresh logs the outage

    async def close(self) -> None:
        self.closing = True
        await self.limiter.close()

    # -- admin -------------------------------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        return [k.public() for k in sorted(self.ring.keys.values(), key=lambda k: k.name)]

    async def put(self, name: str, write: KeyWrite, actor: str) -> dict[str, Any]:
        """Create or change key `name`; raises `ValueError` for a new key without a secret."""
        store = self._store()
        if not self.hash_key_shared:
            raise StoreUnavailable(RuntimeError("the key-hash secret has not been read from Redis yet"))
        old = self.stored.get(name)
        digest = (secret_hash(write.secret, self.hash_key) if write.secret else
                  old.secret_hmac if old is not None else None)
        if digest is None and name not in self.static_secrets:
            raise ValueError(f"key {name!r} has no secret yet: give one (`secret`, at least 16 characters)")
        other = self.ring.by_hash.get(digest) if write.secret and digest is not None else None
        if other is not None and other.name != name:
            raise ValueError("that secret is already another key's: give each key its own")
        new = StoredKey(**write.model_dump(exclude={"secret"}), secret_hmac=digest)
        before = self.ring.keys.get(name)
        entry = {"time": time.time(), "actor": actor, "action": "key:put", "key": name,
                 "old": before.public() if before is not None else None,
                 "new": {"name": name, **write.model_dump(mode="json", exclude={"secret"})},
                 "secret_changed": bool(write.secret)}
        await self._write(store, lambda p: p.hset(KEYS_KEY, name, new.model_dump_json()), entry)
        self.stored[name] = new
        self._rebuild()
        return self.ring.keys[name].public()

    async def delete(self, name: str, actor: str) -> bool:
        store = self._store()
        before = self.ring.keys.get(name)
        if name not in self.stored:
            return False
        entry = {"time": time.time(), "actor": actor, "action": "key:delete", "key": name,
                 "old": before.public() if before is not None else None, "new": None}
        await self._write(store, lambda p: p.hdel(KEYS_KEY, name), entry)
        self.stored.pop(name, None)
        self._rebuild()
        return True

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        store = self._store()
        try:
            raw = await store.client.lrange(AUDIT_KEY, -limit, -1)
        except FAILURES as exc:
            self.metrics.redis_errors.inc()
            raise StoreUnavailable(exc) from exc
        return [orjson.loads(r) for r in reversed(raw)]

    def _store(self) -> PolicyStore:
        if self.store is None:
            raise StoreNotConfigured()
        return self.store

    async def _write(self, store: PolicyStore, op: Any, entry: dict[str, Any]) -> None:
        try:
            async with store.client.pipeline(transaction=True) as pipe:
                op(pipe)
                pipe.rpush(AUDIT_KEY, orjson.dumps(entry))
                pipe.ltrim(AUDIT_KEY, -MAX_AUDIT, -1)
                await pipe.execute()
        except FAILURES as exc:
            self.metrics.redis_errors.inc()
            raise StoreUnavailable(exc) from exc
        log.info("%s %s by %s", entry["action"], entry["key"], entry["actor"])
