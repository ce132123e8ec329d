"""Per-request acceptance feedback and the decayed per domain x pool statistics in Redis.

Shared by both sides of the wire: engine workers *write* one record per finished request, gateways
*read* the aggregates. This module therefore imports neither torch, FastAPI nor grpc, and neither
wing (`router/`, `engines/`); `redis` only through the client you pass in.

Redis layout (prefix `specroute:`, see ARCHITECTURE.md):

- `specroute:feedback`: stream, one entry per finished request, capped with `MAXLEN ~`.
- `specroute:stats:{domain}:{pool}`: hash of exponentially decayed sums
  `n, tokens, drafted, accepted, steps, decode_ms, ttft_ms, wall_ms` plus `t` (server time of the
  last update, seconds). On every update all sums are multiplied by `0.5 ** (dt / half_life_s)` and
  the new record is added, atomically in one Lua script (`UPDATE_STATS_LUA`). The half-life is read
  from the current policy document (`specroute:policy`, field `half_life_s`) so operators tune it
  live; `DEFAULT_HALF_LIFE_S` applies when there is no policy yet.

`decay_update` is the pure Python reference of the script (tests check that both agree) and
`CellStats.decayed_to` is what readers use to age a snapshot to "now".
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from specroute.contracts.stats import mean_accepted_length

PREFIX = "specroute:"
FEEDBACK_STREAM = PREFIX + "feedback"
POLICY_KEY = PREFIX + "policy"
DEFAULT_HALF_LIFE_S = 300.0
DEFAULT_STREAM_MAXLEN = 100_000

STAT_FIELDS: tuple[str, ...] = ("n", "tokens", "drafted", "accepted", "steps", "decode_ms", "ttft_ms", "wall_ms")


def stats_key(domain: str, pool: str) -> str:
    return f"{PREFIX}stats:{domain}:{pool}"


@dataclass(frozen=True, slots=True)
class FeedbackRecord:
    """One finished request, as reported by the worker that served it."""

    pool: str
    domain: str
    tokens: int  # completion tokens emitted
    drafted: int  # draft tokens sent to verification
    accepted: int  # draft tokens accepted (bonus token excluded)
    steps: int  # verification steps (target forwards after prefill)
    wall_ms: float  # request wall time in the worker
    ttft_ms: float  # time to first token in the worker
    request_id: str = ""
    engine: str = ""

    def values(self) -> dict[str, float]:
        """The additive contribution of this record to the aggregates (one request)."""
        return {
            "n": 1.0,
            "tokens": float(self.tokens),
            "drafted": float(self.drafted),
            "accepted": float(self.accepted),
            "steps": float(self.steps),
            "decode_ms": max(0.0, float(self.wall_ms) - float(self.ttft_ms)),
            "ttft_ms": float(self.ttft_ms),
            "wall_ms": float(self.wall_ms),
        }


@dataclass(frozen=True, slots=True)
class CellStats:
    """Decayed aggregates of one domain x pool cell (all sums, so ratios are decay-invariant)."""

    n: float = 0.0  # requests
    tokens: float = 0.0  # completion tokens
    drafted: float = 0.0  # draft tokens sent to verification
    accepted: float = 0.0  # draft tokens accepted (bonus excluded)
    steps: float = 0.0  # verification steps
    decode_ms: float = 0.0  # worker wall time after the first token
    ttft_ms: float = 0.0  # worker time to first token
    wall_ms: float = 0.0  # worker wall time
    t: float = 0.0  # Redis server time of the last update, s (0 = never)

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> CellStats:
        """Parse a Redis hash (bytes or str keys/values); missing or bad fields count as 0."""
        vals: dict[str, float] = {}
        for k, v in raw.items():
            key = k.decode() if isinstance(k, bytes) else str(k)
            if key in STAT_FIELDS or key == "t":
                try:
                    x = float(v)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(x):
                    vals[key] = x
        return cls(**vals)

    def decayed_to(self, now: float, half_life_s: float) -> CellStats:
        f = decay_factor(self.t, now, half_life_s)
        if f == 1.0:
            return self
        d = {k: getattr(self, k) * f for k in STAT_FIELDS}
        return CellStats(**d, t=now)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verification step, bonus included (`specroute.contracts.stats`)."""
        return mean_accepted_length(self.accepted, self.steps)

    @property
    def draft_len(self) -> float | None:
        """Mean draft tokens per step (block size after D-Cut)."""
        return self.drafted / self.steps if self.steps > 0 else None

    @property
    def step_ms(self) -> float | None:
        return self.decode_ms / self.steps if self.steps > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        """Observed per-request decode goodput (output tokens per second of decode time)."""
        return 1000.0 * self.tokens / self.decode_ms if self.decode_ms > 0 else None

    def as_dict(self) -> dict[str, float | None]:
        d: dict[str, float | None] = dict(asdict(self))
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            draft_len=self.draft_len,
            step_ms=self.step_ms,
            tokens_per_s=self.tokens_per_s,
        )
        return d


def decay_factor(t_prev: float, now: float, half_life_s: float) -> float:
    if t_prev <= 0 or half_life_s <= 0 or now <= t_prev:
        return 1.0
    return 0.5 ** ((now - t_prev) / half_life_s)


def decay_update(old: CellStats, rec: FeedbackRecord, now: float, half_life_s: float) -> CellStats:
    """Pure reference of `UPDATE_STATS_LUA`: age `old` to `now`, then add `rec`."""
    f = decay_factor(old.t, now, half_life_s)
    add = rec.values()
    return CellStats(**{k: getattr(old, k) * f + add[k] for k in STAT_FIELDS}, t=now)


# KEYS[1] stats hash, KEYS[2] feedback stream, KEYS[3] policy document
# ARGV[1] default half-life s, ARGV[2] stream MAXLEN, ARGV[3..10] values in STAT_FIELDS order,
# ARGV[11..] stream entry field/value pairs
UPDATE_STATS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local hl = tonumber(ARGV[1])
local p = redis.call('GET', KEYS[3])
if p then
  local ok, doc = pcall(cjson.decode, p)
  if ok and type(doc) == 'table' and tonumber(doc['half_life_s']) then hl = tonumber(doc['half_life_s']) end
end
local fields = {'n', 'tokens', 'drafted', 'accepted', 'steps', 'decode_ms', 'ttft_ms', 'wall_ms'}
local prev = redis.call('HMGET', KEYS[1], 't', unpack(fields))
local f = 1.0
local pt = tonumber(prev[1])
if pt and pt > 0 and hl > 0 and now > pt then f = math.pow(0.5, (now - pt) / hl) end
local out = {}
for i, name in ipairs(fields) do
  local v = (tonumber(prev[i + 1]) or 0) * f + tonumber(ARGV[2 + i])
  out[#out + 1] = name
  out[#out + 1] = string.format('%.17g', v)
end
out[#out + 1] = 't'
out[#out + 1] = string.format('%.6f', now)
redis.call('HSET', KEYS[1], unpack(out))
local entry = {}
for i = 11, #ARGV do entry[#entry + 1] = ARGV[i] end
entry[#entry + 1] = 'ts'
entry[#entry + 1] = string.format('%.6f', now)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(entry))
return string.format('%.6f', now)
"""


def script_args(
    rec: FeedbackRecord,
    default_half_life_s: float = DEFAULT_HALF_LIFE_S,
    maxlen: int = DEFAULT_STREAM_MAXLEN,
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV for `UPDATE_STATS_LUA` (exposed for callers that pipeline the script)."""
    vals = rec.values()
    entry = {
        "pool": rec.pool,
        "domain": rec.domain,
        "tokens": rec.tokens,
        "drafted": rec.drafted,
        "accepted": rec.accepted,
        "steps": rec.steps,
        "wall_ms": round(float(rec.wall_ms), 3),
        "ttft_ms": round(float(rec.ttft_ms), 3),
        "request_id": rec.request_id,
        "engine": rec.engine,
    }
    argv = [repr(float(default_half_life_s)), str(int(maxlen))]
    argv += [repr(vals[k]) for k in STAT_FIELDS]
    for k, v in entry.items():
        argv += [k, str(v)]
    keys = [stats_key(rec.domain or "unknown", rec.pool or "unknown"), FEEDBACK_STREAM, POLICY_KEY]
    return keys, argv


def make_recorder(
    client: Any,
    default_half_life_s: float = DEFAULT_HALF_LIFE_S,
    maxlen: int = DEFAULT_STREAM_MAXLEN,
) -> Callable[[FeedbackRecord], Any | Awaitable[Any]]:
    """Return `record(rec)` bound to a `redis.Redis` or `redis.asyncio.Redis` client.

    With an asyncio client the returned function is a coroutine function (await it); with a sync
    client it runs the script immediately. Either way one round trip, atomic, no read-modify-write
    race between workers.
    """
    script = client.register_script(UPDATE_STATS_LUA)

    def record(rec: FeedbackRecord) -> Any:
        keys, argv = script_args(rec, default_half_life_s, maxlen)
        return script(keys=keys, args=argv)

    return record
