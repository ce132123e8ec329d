"""The one reader of the routing statistics (specroute/contracts/feedback.py), for the gateway's
snapshot, off the request path.

Bounded: the level index (`{specroute}:stats:v2:index`, a sorted set by last update) names the recently
updated level cells (domains and contexts); at most `cap` of them, the most recent first, plus one
global cell per pool, are read in two pipelined round trips, with the Redis server time to age them
to (on a Redis Cluster, whose pipelines take no TIME, the time of the node holding the `{specroute}`
slot, one more round trip). `migrate_v1` (run once at start) moves the retired per-domain hashes into the one schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from specroute.contracts.context import GLOBAL_LEVEL
from specroute.contracts.feedback import CONTEXT_INDEX, MAX_CONTEXT_CELLS, CellStats, split_member, stats_key
from specroute.contracts.feedback import migrate_v1 as migrate_v1

Cells = dict[tuple[str, str], CellStats]  # (level, pool) -> stats; a level is a domain, a context key or "*"


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def is_domain(level: str) -> bool:
    """Whether a level is a domain (not the global level, not a context key)."""
    return level != GLOBAL_LEVEL and "|" not in level


def domain_cells(cells: Mapping[tuple[str, str], CellStats]) -> Cells:
    """The per domain x pool cells (dashboards, `specroute_pool_mean_accepted_length`)."""
    return {cell: s for cell, s in cells.items() if is_domain(cell[0])}


async def pull_cells(client: Any, pools: Sequence[str], cap: int = MAX_CONTEXT_CELLS) -> tuple[float, Cells]:
    """The Redis server time, the global cell of each pool in `pools` and the (at most `cap`) most
    recently updated level cells of those pools, not yet aged (`CellStats.decayed_to`)."""
    cluster = isinstance(client, RedisCluster)   # its pipelines refuse keyless commands such as TIME
    pipe = client.pipeline(transaction=False)
    if not cluster:
        pipe.time()
    pipe.zrevrange(CONTEXT_INDEX, 0, max(cap, 1) - 1)
    for p in pools:
        pipe.hgetall(stats_key(GLOBAL_LEVEL, p))
    res = await pipe.execute()
    if cluster:   # the clock of the node that holds the cells (the one the update script read)
        res = [await client.time(target_nodes=client.get_node_from_key(CONTEXT_INDEX)), *res]
    sec, usec = res[0]
    out: Cells = {(GLOBAL_LEVEL, p): CellStats.from_hash(raw) for p, raw in zip(pools, res[2:], strict=True) if raw}
    wanted = set(pools)
    cells: list[tuple[str, str]] = []
    for m in res[1] or ():
        level, pool = split_member(_text(m))
        if level and pool in wanted:
            cells.append((level, pool))
    if cells:
        pipe = client.pipeline(transaction=False)
        for lvl, p in cells:
            pipe.hgetall(stats_key(lvl, p))
        for cell, raw in zip(cells, await pipe.execute(), strict=True):
            if raw:
                out[cell] = CellStats.from_hash(raw)
    return float(sec) + float(usec) / 1e6, out
