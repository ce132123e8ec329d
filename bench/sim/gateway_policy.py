"""The one place the simulator touches the gateway's policy code (`router/`): every name it uses is
imported here, so a move inside `router/` is a change to this file alone. `router/` never imports
the simulator.

- `decide`, `Policy`, `default_policy`: the operator's document and the pure decision;
- `PoolState`: what the decision knows of a pool's health and load (its load term);
- `learn`: the statistics update a worker's feedback record makes (the Redis script's pure reference,
  applied to every level the record updates);
- `choose_endpoint`: batch affinity's choice of a worker within a pool;
- `prompt_features`, `request_features`, `fit`, `Sample`, `Predictor`, `PoolModel`, `predict`,
  `level_mean`: the per-request acceptance predictor's features and fit (bench/sim/predictor.py);
- `level_keys`: the statistics levels of a request.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.routing.affinity import Candidate, choose
from router.routing.decide import Decision, decide
from router.routing.estimate import PoolState
from router.routing.features import prompt_features, request_features
from router.routing.policy import Policy, default_policy
from router.routing.predictor import PoolModel, Predictor, Sample, fit, level_mean, predict
from specroute.contracts.context import (
    GLOBAL_LEVEL,
    RequestContext,
    context_keys_for,
    level_keys,
    temperature_bucket,
)
from specroute.contracts.feedback import CellStats, FeedbackRecord, decay_update

__all__ = ["GLOBAL_LEVEL", "Candidate", "CellStats", "Decision", "FeedbackRecord", "Policy", "PoolModel",
           "PoolState", "Predictor", "RequestContext", "Sample", "choose_endpoint", "decide", "default_policy", "fit",
           "kind_of", "learn", "level_keys", "level_mean", "predict", "prompt_features", "request_features"]

Stats = dict[tuple[str, str], CellStats]


def kind_of(temperature: float | None) -> str:
    """The batch kind (hot or cool) the gateway groups a request's rows by (`RequestContext.batch`)."""
    return RequestContext(temperature=temperature_bucket(temperature)).batch


def learn(stats: Stats, rec: FeedbackRecord, now: float, half_life_s: float) -> None:
    """Apply one feedback record to `stats` in place: its domain cell, the pool's global cell and its
    context cells (what `UPDATE_STATS_LUA` does in Redis), each decayed to `now`."""
    levels = (rec.domain or "unknown", GLOBAL_LEVEL, *context_keys_for(rec.context, rec.domain))
    for level in levels:
        key = (level, rec.pool)
        stats[key] = decay_update(stats.get(key, CellStats()), rec, now, half_life_s)


def choose_endpoint(loads: Sequence[tuple[int, int, int]], capacity: int, slack: float,
                    rng: random.Random) -> int:
    """Index of the worker that takes a request; `loads[i]` = (the endpoint's load in rows: its worker's
    requests in flight, or its polled load when higher; rows of the request's kind on its worker, rows
    on its worker), as `router/workers/pools.py` `pick` builds them."""
    cands = [Candidate(n / capacity, 1.0 / capacity, same, total) for n, same, total in loads]
    best = choose(cands, slack)
    return best[0] if len(best) == 1 else rng.choice(best)

