"""The shadow policy: a candidate the operator submitted, stored in Redis beside the live policy, and
this gateway's tally of how the two compare on live traffic.

- `{specroute}:policy:shadow`: `{"id", "time", "actor", "note", "policy"}`, the candidate (at most one).
- Every submit and discard appends an entry to the policy history (`specroute:policy:versions`, the
  audit log of policy changes) with `action` `shadow:submit` / `shadow:discard`, `shadow: true`, the
  live version it was made against, the candidate and its diff from the live policy. A promote is a
  policy write like any other (`action` `shadow:promote`), after which the shadow is gone.

The tally (`ShadowTally`) counts, per shadow id, the requests both policies decided, how often they
chose the same pool, and the mean predicted goodput of each side's pool over the requests where both
are predicted (router/routing/shadow.py); it lives in this process and starts over with each new
candidate.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.routing.policy import Policy, diff_policies
from router.routing.shadow import Comparison
from router.state.store import MAX_HISTORY, VERSIONS_KEY, PolicyStore
from specroute.contracts.feedback import PREFIX

SHADOW_KEY = PREFIX + "policy:shadow"


@dataclass(frozen=True, slots=True)
class ShadowDoc:
    id: str
    policy: Policy
    actor: str = ""
    time: float = 0.0
    note: str = ""

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "actor": self.actor, "time": self.time, "note": self.note,
                "policy": self.policy.model_dump(mode="json")}


def parse_shadow(raw: bytes | str | None) -> ShadowDoc | None:
    if raw is None:
        return None
    d = orjson.loads(raw)
    return ShadowDoc(str(d["id"]), Policy.model_validate(d["policy"]), str(d.get("actor", "")),
                     float(d.get("time", 0.0)), str(d.get("note", "")))


async def load_shadow(store: PolicyStore) -> ShadowDoc | None:
    try:
        return parse_shadow(await store.client.get(SHADOW_KEY))
    except (ValueError, KeyError, TypeError):
        return None   # not a valid document: no shadow


def _audit(action: str, actor: str, live: Policy, candidate: Policy, note: str, shadow_id: str) -> bytes:
    data = candidate.model_dump(mode="json")
    return orjson.dumps({"version": live.version, "time": time.time(), "actor": actor, "action": action,
                         "note": note, "shadow": True, "shadow_id": shadow_id,
                         "diff": diff_policies(live.model_dump(mode="json"), data), "policy": data})


async def submit_shadow(store: PolicyStore, candidate: Policy, actor: str, live: Policy, note: str) -> ShadowDoc:
    """Store `candidate` as the shadow (replacing any) and audit it."""
    doc = ShadowDoc(uuid.uuid4().hex[:12], candidate.model_copy(update={"version": 0}), actor, time.time(), note)
    async with store.client.pipeline(transaction=True) as pipe:
        pipe.set(SHADOW_KEY, orjson.dumps(doc.view()))
        pipe.rpush(VERSIONS_KEY, _audit("shadow:submit", actor, live, doc.policy, note, doc.id))
        pipe.ltrim(VERSIONS_KEY, -MAX_HISTORY, -1)
        await pipe.execute()
    return doc


_CLEAR_LUA = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, d = pcall(cjson.decode, cur)
if not ok or type(d) ~= 'table' or d['id'] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1)
end
return 1
"""


async def clear_shadow(store: PolicyStore, doc: ShadowDoc, actor: str, live: Policy, note: str,
                       action: str = "shadow:discard") -> bool:
    """Remove the shadow `doc` if it is still the stored one (one script: a candidate submitted
    meanwhile stays); a discard is audited (a promote's audit entry is its policy write). False when
    `doc` was no longer there."""
    entry = _audit(action, actor, live, doc.policy, note, doc.id) if action else b""
    done = await store.client.eval(_CLEAR_LUA, 2, SHADOW_KEY, VERSIONS_KEY, doc.id, entry, MAX_HISTORY)
    return bool(int(done))


@dataclass(slots=True)
class _Counts:
    requests: int = 0
    agree: int = 0
    scored: int = 0          # requests where both sides' pools have a prediction
    live_sum: float = 0.0    # summed predicted goodput over the scored requests
    shadow_sum: float = 0.0

    def add(self, c: Comparison) -> None:
        self.requests += 1
        self.agree += c.agree
        if c.live_goodput is not None and c.shadow_goodput is not None:
            self.scored += 1
            self.live_sum += c.live_goodput
            self.shadow_sum += c.shadow_goodput

    def view(self) -> dict[str, Any]:
        live = self.live_sum / self.scored if self.scored else None
        shadow = self.shadow_sum / self.scored if self.scored else None
        return {"requests": self.requests, "agree": self.agree, "scored": self.scored,
                "live_goodput": None if live is None else round(live, 3),
                "shadow_goodput": None if shadow is None else round(shadow, 3),
                "gain": None if not live or shadow is None else round(shadow / live - 1.0, 4)}


@dataclass(slots=True)
class ShadowTally:
    """This gateway's comparison of the live policy and the shadow `shadow_id` (module docstring)."""

    shadow_id: str = ""
    total: _Counts = field(default_factory=_Counts)
    domains: dict[str, _Counts] = field(default_factory=dict)
    pools: dict[tuple[str, str], int] = field(default_factory=dict)   # (live pool, shadow pool) -> requests

    def add(self, c: Comparison) -> None:
        self.total.add(c)
        self.domains.setdefault(c.domain, _Counts()).add(c)
        key = (c.live_pool or "none", c.shadow_pool or "none")
        self.pools[key] = self.pools.get(key, 0) + 1

    def view(self) -> dict[str, Any]:
        return {"shadow_id": self.shadow_id, **self.total.view(),
                "domains": {d: c.view() for d, c in sorted(self.domains.items())},
                "pools": [{"live": a, "shadow": b, "requests": n} for (a, b), n in sorted(self.pools.items())]}
