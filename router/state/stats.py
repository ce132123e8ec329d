"""Pull the v2 statistics cells (per request context and per pool, specroute/contracts/feedback.py)
for the gateway's snapshot, off the request path.

Bounded: the context index (`specroute:stats:v2:index`, a sorted set by last update) names the
recently updated context cells; at most `cap` of them, the most recent first, plus one global cell
per pool, are read in two pipelined round trips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specroute.contracts.context import GLOBAL_LEVEL
from specroute.contracts.feedback import (
    CONTEXT_INDEX,
    MAX_CONTEXT_CELLS,
    CellStats,
    context_stats_key,
    global_stats_key,
    split_member,
)

Cells = dict[tuple[str, str], CellStats]  # (context key or "*", pool) -> decayed stats


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def cell_key(level: str, pool: str) -> str:
    return global_stats_key(pool) if level == GLOBAL_LEVEL else context_stats_key(level, pool)


async def pull_context_cells(client: Any, pools: Sequence[str], cap: int = MAX_CONTEXT_CELLS) -> Cells:
    """The global cell of each pool in `pools` and the (at most `cap`) most recently updated context
    cells of those pools, not yet aged (`CellStats.decayed_to`)."""
    pipe = client.pipeline(transaction=False)
    pipe.zrevrange(CONTEXT_INDEX, 0, max(cap, 1) - 1)
    for p in pools:
        pipe.hgetall(global_stats_key(p))
    res = await pipe.execute()
    out: Cells = {(GLOBAL_LEVEL, p): CellStats.from_hash(raw) for p, raw in zip(pools, res[1:], strict=True) if raw}
    wanted = set(pools)
    cells: list[tuple[str, str]] = []
    for m in res[0] or ():
        ctx, pool = split_member(_text(m))
        if ctx and pool in wanted:
            cells.append((ctx, pool))
    if cells:
        pipe = client.pipeline(transaction=False)
        for lvl, p in cells:
            pipe.hgetall(cell_key(lvl, p))
        for cell, raw in zip(cells, await pipe.execute(), strict=True):
            if raw:
                out[cell] = CellStats.from_hash(raw)
    return out
