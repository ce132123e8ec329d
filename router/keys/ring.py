"""Named client API keys with limits: who may call `/v1/*`, how often, and where their requests go.

A key has a name (operator-defined, bounded: it is a metric label and an audit actor), a secret
(kept only as its SHA-256; never returned by any endpoint), optional requests-per-minute and
tokens-per-minute limits (router/keys/ratelimit.py) and optional allow-lists of pools and domains.

Keys come from two places, merged by name:

- static: `SPECROUTE_API_KEYS` / `--api-key` / `--api-key-file` (secrets) and
  `SPECROUTE_API_KEY_LIMITS` (`{"name": {"rpm": 60, "tpm": 100000, "pools": [...], "domains": [...]}}`);
- Redis (`specroute:keys`, hash name -> JSON `StoredKey`), written by the admin API
  (`/admin/keys`), read by every gateway about once a second. A stored entry overrides a static
  key's limits, and its secret (when it has one) replaces the static secret; deleting it restores the
  static key.

`KeyRing` is the request path's view: an immutable lookup from the secret's hash to the key, swapped
whole. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from router.routing.policy import MAX_DOMAINS, MAX_POOLS

KEYS_KEY = "specroute:keys"
AUDIT_KEY = "specroute:audit"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_KEYS = 1000  # names are metric label values: keep their number bounded


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class KeyLimits(BaseModel):
    """What an operator sets on a key (the admin API's and `SPECROUTE_API_KEY_LIMITS`' schema)."""

    model_config = ConfigDict(extra="forbid")

    rpm: int | None = Field(default=None, ge=1, le=10_000_000, description="requests per minute (none: unlimited)")
    tpm: int | None = Field(default=None, ge=1, le=10_000_000_000, description="tokens per minute (none: unlimited)")
    pools: list[str] = Field(default_factory=list, max_length=MAX_POOLS, description="allowed pools (empty: all)")
    domains: list[str] = Field(default_factory=list, max_length=MAX_DOMAINS,
                               description="allowed domains (empty: all)")
    disabled: bool = False


class KeyWrite(KeyLimits):
    """`PUT /admin/keys/{name}`: the limits, and the secret (required for a key that has none yet)."""

    secret: str | None = Field(default=None, min_length=16, max_length=256)


class StoredKey(KeyLimits):
    """A key's entry in `specroute:keys` (the secret only as its hash)."""

    secret_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    limits: KeyLimits
    source: str  # "static", "stored" or "static+stored"

    @property
    def limited(self) -> bool:
        return self.limits.rpm is not None or self.limits.tpm is not None

    def public(self) -> dict[str, Any]:
        """What `GET /admin/keys` shows (never the secret or its hash)."""
        return {"name": self.name, "source": self.source, **self.limits.model_dump(mode="json")}


@dataclass(frozen=True, slots=True)
class KeyRing:
    by_hash: Mapping[str, ApiKey]
    keys: Mapping[str, ApiKey]

    @property
    def active(self) -> bool:
        """Whether `/v1/*` needs a key at all (no keys anywhere: open, as before named keys)."""
        return bool(self.by_hash)

    def lookup(self, token: str | None) -> ApiKey | None:
        if not token:
            return None
        key = self.by_hash.get(secret_hash(token))
        return None if key is None or key.limits.disabled else key


EMPTY = KeyRing({}, {})


def build_ring(static_secrets: Mapping[str, str], static_limits: Mapping[str, KeyLimits],
               stored: Mapping[str, StoredKey]) -> KeyRing:
    by_hash: dict[str, ApiKey] = {}
    keys: dict[str, ApiKey] = {}
    for name in list(dict.fromkeys([*static_secrets, *stored]))[:MAX_KEYS]:
        st = stored.get(name)
        static = name in static_secrets
        source = "static+stored" if static and st is not None else ("static" if static else "stored")
        limits = (KeyLimits.model_validate(st.model_dump(exclude={"secret_sha256"})) if st is not None
                  else static_limits.get(name, KeyLimits()))
        key = ApiKey(name, limits, source)
        keys[name] = key
        digest = (st.secret_sha256 if st is not None and st.secret_sha256 else
                  secret_hash(static_secrets[name]) if static else None)
        if digest is not None:
            by_hash[digest] = key
    return KeyRing(by_hash, keys)


def parse_limits(value: Any) -> dict[str, KeyLimits]:
    """`SPECROUTE_API_KEY_LIMITS`: a JSON object name -> `KeyLimits` (or the parsed mapping)."""
    import json

    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise ValueError("api key limits must be a mapping of key name to limits")
    return {str(k): v if isinstance(v, KeyLimits) else KeyLimits.model_validate(v) for k, v in value.items()}
