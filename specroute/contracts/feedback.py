"""Per-request acceptance feedback and the decayed statistics in Redis, per domain, per request
context and per pool.

Shared by both sides of the wire: engine workers *write* one record per finished request, gateways
*read* the aggregates. This module therefore imports neither torch, FastAPI nor grpc, and neither
wing (`router/`, `engines/`); `redis` only through the client you pass in.

Redis layout (prefix `{specroute}:`, a hash tag, so that a Redis Cluster serves every key the update
script names from one slot; see docs/redis-layout.md), one schema:

- `{specroute}:feedback`: stream, one entry per finished request, capped with `MAXLEN ~` (its counts,
  context and the gateway's request features: what the acceptance predictor is trained from).
- `{specroute}:stats:v2:all:<pool>`: every request of the pool (the global level).
- `{specroute}:stats:v2:ctx:<level>:<pool>`: one level of a request's back-off
  (specroute/contracts/context.py `level_keys`): its domain (`code`), coarse context (`d=code|t=0`) and
  full context (`d=code|s=latin|t=0|l=short`); these expire after `max(CONTEXT_MIN_TTL_S, 20
  half-lives)` without an update.
- `{specroute}:stats:v2:index`: sorted set of those level cells (`<level>:<pool>`) scored by the server
  time of their last update; entries older than the TTL are removed and it is capped at
  `MAX_CONTEXT_CELLS` (most recent kept), so gateways pull a bounded set of recent cells.

Every stats hash holds exponentially decayed sums of `STAT_FIELDS` plus `t` (server time of the last
update, seconds). One script call (`update_stats_lua()`) updates every cell of a record atomically:
on each, all sums are multiplied by `0.5 ** (dt / half_life_s)` and the new record is added. The
half-life is read from the current policy document (`{specroute}:policy`, field `half_life_s`);
`DEFAULT_HALF_LIFE_S` applies when there is no policy yet. A record's domain outside
`[A-Za-z0-9_.-]{1,64}` counts as `unknown`; its context updates cells only when valid and of its domain.
The per-domain hashes of the first layout (`{specroute}:stats:<domain>:<pool>`, before the hash tag
`specroute:stats:<domain>:<pool>`) are retired: `migrate_v1` moves them into the domain cells.

`decay_update` is the pure Python reference of the script for one cell (tests check that both agree)
and `CellStats.decayed_to` is what readers use to age a snapshot to "now".
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specroute.contracts.context import GLOBAL_LEVEL, context_keys_for, domain_level
from specroute.contracts.stats import mean_accepted_length

PREFIX = "{specroute}:"   # one hash tag: a Redis Cluster keeps every multi-key script's keys in one slot
LEGACY_PREFIX = "specroute:"   # the names before the hash tag (`specroute.redis_url.migrate_legacy_names`)
FEEDBACK_STREAM = PREFIX + "feedback"
POLICY_KEY = PREFIX + "policy"
DEFAULT_HALF_LIFE_S = 300.0
DEFAULT_STREAM_MAXLEN = 100_000
CONTEXT_INDEX = PREFIX + "stats:v2:index"
MAX_CONTEXT_CELLS = 2048
CONTEXT_MIN_TTL_S = 3600

MAX_FEATURES = 64   # features a record carries at most

STAT_FIELDS: tuple[str, ...] = ("n", "tokens", "drafted", "accepted", "steps", "decode_ms", "ttft_ms", "wall_ms")


V1_STATS = PREFIX + "stats:"   # the retired per-domain hashes, `{specroute}:stats:<domain>:<pool>`


def stats_key(level: str, pool: str) -> str:
    """The cell of one back-off level (a domain, a context key, or `GLOBAL_LEVEL`) of a pool."""
    if level == GLOBAL_LEVEL:
        return f"{PREFIX}stats:v2:all:{pool}"
    return f"{PREFIX}stats:v2:ctx:{context_member(level, pool)}"


def context_member(context: str, pool: str) -> str:
    """A context cell's member in `CONTEXT_INDEX`."""
    return f"{context}:{pool}"


def split_member(member: str) -> tuple[str, str]:
    """(context, pool) of an index member (a context holds no `:`; a pool name might)."""
    context, _, pool = member.partition(":")
    return context, pool


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
    context: str = ""  # the gateway's request context key (specroute/contracts/context.py)
    features: tuple[float, ...] = ()  # the gateway's request features (router/routing/features.py), for the predictor

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


def build_record(*, request_id: str, pool: str, domain: str, context: str, engine: str, tokens: int,
                 counts: tuple[int, int, int], wall_s: float, ttft_s: float,
                 features: Sequence[float] = ()) -> FeedbackRecord:
    """The one way a record is made, by a worker or a gateway: `counts` = (drafted, accepted, steps),
    times in seconds; an empty domain is `unknown`; at most `MAX_FEATURES` finite features are kept
    (none otherwise)."""
    drafted, accepted, steps = counts
    feats = tuple(float(x) for x in features)
    if len(feats) > MAX_FEATURES or not all(math.isfinite(x) for x in feats):
        feats = ()
    return FeedbackRecord(pool=pool, domain=domain or "unknown", tokens=tokens, drafted=drafted, accepted=accepted,
                          steps=steps, wall_ms=wall_s * 1000.0, ttft_ms=ttft_s * 1000.0, request_id=request_id,
                          engine=engine, context=context, features=feats)


def format_features(features: Sequence[float]) -> str:
    """A record's features as its stream entry holds them (comma-separated, 4 decimals; "" for none)."""
    return ",".join(f"{x:.4f}" for x in features)


def parse_features(text: str) -> tuple[float, ...]:
    """The features of a stream entry (`format_features`); () when absent or malformed."""
    if not text:
        return ()
    try:
        out = tuple(float(x) for x in text.split(",", MAX_FEATURES))
    except ValueError:
        return ()
    return out if len(out) <= MAX_FEATURES and all(math.isfinite(x) for x in out) else ()


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


# KEYS[1] feedback stream, KEYS[2] policy document, KEYS[3] level index, KEYS[4] the pool's global cell,
# KEYS[5..4+m] the level cells (domain, then the contexts)
# ARGV[1] default half-life s, ARGV[2] stream MAXLEN, ARGV[3] index cap, ARGV[4] minimum TTL s of a
# level cell, ARGV[5..4+F] values in STAT_FIELDS order (F fields), ARGV[5+F] m, ARGV[6+F..5+F+m] the
# level cells' index members, ARGV[6+F+m..] stream entry field/value pairs
_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local hl = tonumber(ARGV[1])
local p = redis.call('GET', KEYS[2])
if p then
  local ok, doc = pcall(cjson.decode, p)
  if ok and type(doc) == 'table' and tonumber(doc['half_life_s']) then hl = tonumber(doc['half_life_s']) end
end
local fields = {__FIELDS__}
local nf = #fields
local function update(key)
  local prev = redis.call('HMGET', key, 't', unpack(fields))
  local f = 1.0
  local pt = tonumber(prev[1])
  if pt and pt > 0 and hl > 0 and now > pt then f = math.pow(0.5, (now - pt) / hl) end
  local out = {}
  for i, name in ipairs(fields) do
    local v = (tonumber(prev[i + 1]) or 0) * f + tonumber(ARGV[4 + i])
    out[#out + 1] = name
    out[#out + 1] = string.format('%.17g', v)
  end
  out[#out + 1] = 't'
  out[#out + 1] = string.format('%.6f', now)
  redis.call('HSET', key, unpack(out))
end
for i = 4, #KEYS do update(KEYS[i]) end
local m = tonumber(ARGV[5 + nf])
if m > 0 then
  local ttl = math.max(tonumber(ARGV[4]), math.ceil(20 * hl))
  for j = 1, m do
    redis.call('EXPIRE', KEYS[4 + j], ttl)
    redis.call('ZADD', KEYS[3], now, ARGV[5 + nf + j])
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - ttl)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[3]) + 1))
end
local entry = {}
for i = 6 + nf + m, #ARGV do entry[#entry + 1] = ARGV[i] end
entry[#entry + 1] = 'ts'
entry[#entry + 1] = string.format('%.6f', now)
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(entry))
return string.format('%.6f', now)
"""
UPDATE_STATS_LUA = _LUA.replace("__FIELDS__", ", ".join(f"'{f}'" for f in STAT_FIELDS))


def record_levels(rec: FeedbackRecord) -> tuple[str, ...]:
    """The levels below the global one that a record updates: its domain, and its full and coarse
    context when valid and of that domain."""
    domain = domain_level(rec.domain)
    return (domain, *context_keys_for(rec.context, domain))


def record_cells(rec: FeedbackRecord) -> list[str]:
    """Every stats hash one record updates: the pool's global cell, then its level cells."""
    pool = rec.pool or "unknown"
    return [stats_key(GLOBAL_LEVEL, pool), *(stats_key(lvl, pool) for lvl in record_levels(rec))]


def script_args(
    rec: FeedbackRecord,
    default_half_life_s: float = DEFAULT_HALF_LIFE_S,
    maxlen: int = DEFAULT_STREAM_MAXLEN,
    index_cap: int = MAX_CONTEXT_CELLS,
    min_ttl_s: int = CONTEXT_MIN_TTL_S,
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV for `UPDATE_STATS_LUA` (exposed for callers that pipeline the script)."""
    pool = rec.pool or "unknown"
    levels = record_levels(rec)
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
        "context": levels[1] if len(levels) > 1 else "",
        "features": format_features(rec.features),
    }
    argv = [repr(float(default_half_life_s)), str(int(maxlen)), str(int(index_cap)), str(int(min_ttl_s))]
    argv += [repr(vals[k]) for k in STAT_FIELDS]
    argv += [str(len(levels)), *(context_member(lvl, pool) for lvl in levels)]
    for k, v in entry.items():
        argv += [k, str(v)]
    keys = [FEEDBACK_STREAM, POLICY_KEY, CONTEXT_INDEX, *record_cells(rec)]
    return keys, argv


async def migrate_v1(client: Any, min_ttl_s: int = CONTEXT_MIN_TTL_S) -> int:
    """Move the retired per-domain hashes (`{specroute}:stats:<domain>:<pool>`) into the domain cells of
    the one schema (kept where a domain cell already exists) and index them; returns how many moved.
    Idempotent: run by every gateway at start."""
    moved = 0
    async for raw in client.scan_iter(match=V1_STATS + "*", count=500):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        domain, sep, pool = key[len(V1_STATS):].partition(":")
        if domain == "v2" or not sep or not pool:
            continue
        level = domain_level(domain)
        cell = CellStats.from_hash(await client.hgetall(key))
        target = stats_key(level, pool)
        if cell.t > 0 and not await client.exists(target):
            pipe = client.pipeline(transaction=True)
            pipe.hset(target, mapping={**{k: repr(getattr(cell, k)) for k in STAT_FIELDS}, "t": f"{cell.t:.6f}"})
            pipe.expire(target, min_ttl_s)
            pipe.zadd(CONTEXT_INDEX, {context_member(level, pool): cell.t})
            await pipe.execute()
            moved += 1
        await client.delete(key)
    return moved


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
