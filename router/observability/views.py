"""The dashboard's and admin API's read-only views (`GET /admin/stats`, `GET /admin/pools`), built
from what the gateway holds in memory. Pure functions: no I/O, the clock passed in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from router.routing.estimate import PoolState
from router.state.snapshot import Snapshot
from router.workers.endpoint import Endpoint
from specroute.contracts.context import NO_CONSTRAINT

DecisionCounts = Mapping[tuple[str, str, str], int]  # (domain, pool, reason) -> requests


def routing_shares(decisions: DecisionCounts) -> list[dict[str, Any]]:
    """Requests per domain x pool and their share of the domain's requests."""
    totals: Counter[tuple[str, str]] = Counter()
    for (d, p, _r), n in decisions.items():
        totals[(d, p)] += n
    per_domain: Counter[str] = Counter()
    for (d, _p), n in totals.items():
        per_domain[d] += n
    return [
        {"domain": d, "pool": p, "requests": n, "share": n / per_domain[d] if per_domain.get(d) else 0.0}
        for (d, p), n in sorted(totals.items())
    ]


_BUCKETS = {"d": "domain", "s": "script", "t": "temperature", "l": "length", "c": "constraint"}


def level_buckets(level: str) -> dict[str, str]:
    """The buckets a context level names (`d=code|t=0|c=json`: domain, script, temperature, length,
    constraint), the constraint `none` where the key leaves it out; {} for a domain or the global level."""
    if not level.startswith("d="):
        return {}
    parts = dict(p.partition("=")[::2] for p in level.split("|"))
    out = {name: parts[k] for k, name in _BUCKETS.items() if k in parts}
    return {**out, "constraint": parts.get("c", NO_CONSTRAINT)}


def stats_view(snap: Snapshot, decisions: DecisionCounts, redis_ok: bool, now: float) -> dict[str, Any]:
    cells = [{"domain": d, "pool": p, **s.as_dict()} for (d, p), s in sorted(snap.stats.items())]
    # the v2 levels the policy also learns from: global ("*") and per request context
    levels = [{"level": lvl, "pool": p, **level_buckets(lvl), **s.as_dict()} for (lvl, p), s in sorted(snap.cells.items())
              if (lvl, p) not in snap.stats]
    reasons = [{"domain": d, "pool": p, "reason": r, "requests": n} for (d, p, r), n in sorted(decisions.items())]
    return {
        "policy_version": snap.policy.version,
        "snapshot_age_s": (now - snap.fetched_at) if snap.fetched_at else None,
        "redis_ok": redis_ok,
        "cells": cells,
        "context_cells": levels,
        "shifted": [{"domain": d, "pool": p} for d, p in sorted(snap.shifted)],
        "routing": routing_shares(decisions),
        "reasons": reasons,
    }


def pools_view(pools: Mapping[str, list[Endpoint]], states: Mapping[str, PoolState],
               drained: list[str]) -> dict[str, Any]:
    return {
        name: {
            "healthy": states[name].healthy,
            "available_endpoints": states[name].endpoints,
            "drained": name in drained,
            "endpoints": [e.describe() for e in eps],
        }
        for name, eps in pools.items()
    }
