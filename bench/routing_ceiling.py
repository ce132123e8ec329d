"""How much routing could gain at most in a cell of `specroute bench routing` (pure: rows in, numbers out).

A router only chooses among the pools it has; when one pool is the fastest for every kind of request,
no routing beats the fleet of that pool. This says how far above the best single-pool fleet a router
could get, from what the fleets measured on the very same trace:

- per fleet (all-MTP, all-DFly, all-AR: the modes a routed arm can put a request on, a multi-mode
  worker's plain step included) and per unit (a traffic class in a phase, or one request of the
  trace), the seconds per completion token: the sum of the units' end-to-end times over the sum of
  their tokens, over every round. In a closed loop at a fixed concurrency a fleet's throughput is the
  concurrency times its tokens over its requests' end-to-end time, so a fleet's time on the cell is
  estimated as the sum over units of tokens x seconds per token;
- the class oracle sends each class (domain x temperature bucket, per phase: S5's phases run at other
  concurrencies) to its fastest fleet; the request oracle sends each request to the fleet that served
  it fastest. Their gain over the best fleet is `best fleet's time / oracle's time - 1`.

Both are ceilings in the sense that matters here: they assume a request keeps the speed it had in its
fastest fleet whatever else shares its batch. The request oracle is optimistic besides: it picks each
request's luckiest fleet, noise included. The suite ceiling scales every cell's time of the suite's
best fleet by that cell's oracle-to-fleet ratio.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bench.routing_metrics import FLEET_POOLS, Row, traffic_class

Unit = Callable[[Row], str]


def class_unit(r: Row) -> str:
    return f"{r['phase']}:{traffic_class(r)}"


def request_unit(r: Row) -> str:
    return f"{r['phase']}:{r['index']}"


def seconds_per_token(rows: Iterable[Row], unit: Unit) -> dict[str, tuple[float, float]]:
    """unit -> (end-to-end seconds per completion token, mean tokens per request) over the finished rows."""
    secs: dict[str, float] = defaultdict(float)
    toks: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        if r["ok"] and r["completion_tokens"] > 0:
            secs[unit(r)] += r["t_end"] - r["t_send"]
            toks[unit(r)].append(int(r["completion_tokens"]))
    return {u: (secs[u] / sum(t), statistics.fmean(t)) for u, t in toks.items()}


def oracle(fleets: Mapping[str, Sequence[Row]], unit: Unit, detail: bool = False) -> dict[str, Any] | None:
    """The best fleet by estimated time, the oracle's gain over it, the share of tokens each fleet is
    fastest for and (`detail`) each unit's fastest fleet (None with fewer than two fleets). Units some
    fleet did not finish are left out of every estimate; a unit's tokens are their mean over the fleets
    (identical at T=0)."""
    speed = {arm: seconds_per_token(rows, unit) for arm, rows in fleets.items() if arm in FLEET_POOLS and rows}
    if len(speed) < 2:
        return None
    units = sorted(set.intersection(*(set(s) for s in speed.values())))
    if not units:
        return None
    tokens = {u: statistics.fmean(s[u][1] for s in speed.values()) for u in units}
    time = {arm: sum(tokens[u] * s[u][0] for u in units) for arm, s in speed.items()}
    fastest = {u: min(speed, key=lambda a: (speed[a][u][0], a)) for u in units}
    t_oracle = sum(tokens[u] * speed[fastest[u]][u][0] for u in units)
    best = min(time, key=lambda a: (time[a], a))
    share: dict[str, float] = defaultdict(float)
    total = sum(tokens.values())
    for u in units:
        share[fastest[u]] += tokens[u] / total
    return {"best_fleet": best, "gain_over_best_fleet": round(time[best] / t_oracle - 1.0, 4),
            "estimated_time_vs_best": {a: round(t / time[best], 4) for a, t in sorted(time.items())},
            "token_share_by_fastest_fleet": {a: round(v, 4) for a, v in sorted(share.items())},
            "units": len(units), "oracle_to_fleet": {a: round(t_oracle / t, 4) for a, t in sorted(time.items())},
            **({"fastest": fastest} if detail else {})}


def cell_ceiling(fleets: Mapping[str, Sequence[Row]]) -> dict[str, Any]:
    """A cell's class and request oracles (each None without two fleets)."""
    return {"class_oracle": oracle(fleets, class_unit, detail=True), "request_oracle": oracle(fleets, request_unit)}


def suite_ceiling(cells: Sequence[tuple[Mapping[str, Any], Mapping[str, float]]], fleet: str) -> dict[str, Any]:
    """Over cells given as (their `cell_ceiling`, arm -> wall seconds over every round): each oracle's gain
    over `fleet` (the suite's best single-pool fleet), with every cell's time of `fleet` scaled by the
    cell's oracle-to-fleet ratio (cells without an oracle for `fleet` are left out)."""
    out: dict[str, Any] = {"fleet": fleet}
    for kind in ("class_oracle", "request_oracle"):
        base = scaled = 0.0
        for ceiling, wall in cells:
            o = ceiling.get(kind)
            if o and fleet in o["oracle_to_fleet"] and wall.get(fleet):
                base += wall[fleet]
                scaled += wall[fleet] * o["oracle_to_fleet"][fleet]
        out[kind] = round(base / scaled - 1.0, 4) if scaled > 0 else None
    return out
