"""Named client API keys with limits: who may call `/v1/*`, how often, and where their requests go.

A key has a name (operator-defined, bounded: it is a metric label and an audit actor), a secret
(kept only as its HMAC-SHA-256 under the gateway's key-hash secret, `secret_hash`; never returned by
any endpoint), optional requests-per-minute and
tokens-per-minute limits (router/keys/ratelimit.py) and optional allow-lists of pools and domains.

Keys come from two places, merged by name:

- static: `SPECROUTE_API_KEYS` / `--api-key` / `--api-key-file` (secrets) and
  `SPECROUTE_API_KEY_LIMITS` (`{"name": {"rpm": 60, "tpm": 100000, "pools": [...], "domains": [...]}}`);
- Redis (`{specroute}:keys`, hash name -> JSON `StoredKey`), written by the admin API
  (`/admin/keys`), read by every gateway about once a second. A stored entry overrides a static
  key's limits, and its secret (when it has one) replaces the static secret; deleting it restores the
  static key.

`KeyRing` is the request path's view: an immutable lookup from the secret's keyed hash to the key,
swapped whole. Two keys never share a secret: `build_ring` gives a repeated secret to the first key
only (and logs it); the admin API refuses one. An entry with only an unsalted SHA-256
(`secret_sha256`, older versions) is refused: its key keeps its limits but authenticates nothing until
an operator sets a new secret. Pure: no I/O here (but the log line).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from router.routing.policy import MAX_DOMAINS, MAX_POOLS
from specroute.contracts.feedback import PREFIX

log = logging.getLogger("specroute.gateway.keys")

KEYS_KEY = PREFIX + "keys"
HASH_SECRET_KEY = PREFIX + "keys:hash-secret"  # the shared key-hash secret, when the operator sets none
MIN_SECRET_CHARS = 16
AUDIT_KEY = PREFIX + "audit"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_KEYS = 1000  # names are metric label values: keep their number bounded


def secret_bytes(secret: str) -> bytes:
    """A secret as the bytes it was sent as: header values arrive decoded as Latin-1 (every byte one
    character), configured secrets as text (UTF-8)."""
    try:
        return secret.encode("latin-1")
    except UnicodeEncodeError:
        return secret.encode("utf-8")


def secret_hash(secret: str, key: bytes) -> str:
    """HMAC-SHA-256 of the secret's UTF-8 bytes under the gateway's key-hash secret `key`."""
    return hmac.new(key, secret.encode("utf-8"), hashlib.sha256).hexdigest()


def token_hash(token: str, key: bytes) -> str:
    """`secret_hash` of a token as received in a header (Latin-1 decoded bytes, see `secret_bytes`)."""
    return hmac.new(key, secret_bytes(token), hashlib.sha256).hexdigest()


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

    secret: str | None = Field(default=None, min_length=MIN_SECRET_CHARS, max_length=256)


class StoredKey(KeyLimits):
    """A key's entry in `{specroute}:keys` (the secret only as its keyed hash). `secret_sha256` is read
    only to refuse it (an unsalted hash of an older version)."""

    secret_hmac: str | None = None
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
    hash_key: bytes = b""

    @property
    def active(self) -> bool:
        """Whether `/v1/*` needs a key at all (no keys anywhere: open, as before named keys)."""
        return bool(self.by_hash)

    def lookup(self, token: str | None) -> ApiKey | None:
        if not token:
            return None
        key = self.by_hash.get(token_hash(token, self.hash_key))
        return None if key is None or key.limits.disabled else key


EMPTY = KeyRing({}, {})


def build_ring(static_secrets: Mapping[str, str], static_limits: Mapping[str, KeyLimits],
               stored: Mapping[str, StoredKey], hash_key: bytes) -> KeyRing:
    by_hash: dict[str, ApiKey] = {}
    keys: dict[str, ApiKey] = {}
    for name in list(dict.fromkeys([*static_secrets, *stored]))[:MAX_KEYS]:
        st = stored.get(name)
        static = name in static_secrets
        source = "static+stored" if static and st is not None else ("static" if static else "stored")
        limits = (KeyLimits.model_validate(st.model_dump(exclude={"secret_sha256", "secret_hmac"}))
                  if st is not None else static_limits.get(name, KeyLimits()))
        key = ApiKey(name, limits, source)
        keys[name] = key
        if st is not None and st.secret_sha256 and not st.secret_hmac:
            log.error("key %r has an unsalted SHA-256 secret (older version): refused; set a new secret "
                      "with PUT /admin/keys/%s", name, name)
        digest = (st.secret_hmac if st is not None and st.secret_hmac else
                  secret_hash(static_secrets[name], hash_key) if static else None)
        if digest is None:
            continue
        if digest in by_hash:
            log.error("keys %r and %r share a secret: %r authenticates nothing", by_hash[digest].name, name, name)
            continue
        by_hash[digest] = key
    return KeyRing(by_hash, keys, hash_key)


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
