"""Which endpoint of a pool takes a request: the least loaded, and among those about as idle, the one
whose rows are least unlike it (batch affinity).

A worker verifies all its rows in one step, and whether drafting pays is a property of the whole batch.
At temperature 1 every drafter's acceptance falls (MTP's drafter: about 1.8 tokens a step for chat at
T=1, 2.9 at T=0, `bench/results/routing.json` of 39b7026, S3), and a step whose rows are all hot may
do better not drafting (D-Cut's finding; in session 13's runs the all-AR fleet was the fastest for that
traffic in S2 and S3). But one greedy row keeps its step drafting, and a plain row beside drafting rows
saves nothing, its verify being padded to the widest row (engines/modes.py). Least-loaded balancing
deals hot and greedy rows out to every worker alike, so every batch is mixed and no worker's step can
go plain.

So a request carries a kind (`kind_of`: hot, at the temperatures where drafting stops paying, or
cool), each worker counts its in-flight rows of each kind (`router.workers.pools.WorkerLoad`, over every pool
it serves), and among the endpoints whose load is within `slack` rows of the least loaded, those with
the fewest rows of another kind than the request's, and of them the least loaded, take it. `slack`
bounds what balance is given up: 0 is plain least-loaded balancing, and so is traffic of one kind. (A
first version preferred the most rows of the request's kind, net of the others: on traffic of one kind
that sent each request to the busier worker whenever it was within the slack, kept the two workers a
row or two apart, and cost 13% in the code/math half of S3, `bench/results/routing-affinity.json`.)
Measured against least-loaded balancing on the same two multi-mode workers (`routing-affinity2.json`,
five rounds each, back to back): +3.8% in S2 (chat heavy, T 0 / 0.7 / 1; median of the per-round
ratios), +3.7% to +5.5% in every round of S3's second half (the same mix); the share of plain steps
rose from 5% to 13% of S2's. Traffic of one temperature kind (S1, S4, S5, S6) is not affected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specroute.contracts.context import temperature_bucket

HOT = "hot"     # temperature bucket `high` (> 0.8): drafting rarely pays for it
COOL = "cool"   # greedy and low temperatures: drafting pays


def kind_of(temperature: float | None) -> str:
    return HOT if temperature_bucket(temperature) == "high" else COOL


@dataclass(frozen=True, slots=True)
class Candidate:
    score: float     # load, as a fraction of the endpoint's capacity (`Endpoint.score`)
    row: float       # what one row adds to `score` (1 / capacity)
    same: int = 0    # in-flight rows of the request's kind on the endpoint's worker
    total: int = 0   # in-flight rows on the endpoint's worker


def choose(cands: Sequence[Candidate], slack: float) -> list[int]:
    """Indices of the candidates to pick among (at random): the least loaded when `slack` is 0; else
    those within `slack` rows of the least loaded (each in its own rows), and of them the ones with the
    fewest rows of other kinds than the request's; then the least loaded of those."""
    if not cands:
        return []
    low = min(c.score for c in cands)
    near = [i for i, c in enumerate(cands) if c.score <= low + slack * c.row + 1e-12]
    if slack > 0:
        fewest = min(cands[i].total - cands[i].same for i in near)
        near = [i for i in near if cands[i].total - cands[i].same == fewest]
    least = min(cands[i].score for i in near)
    return [i for i in near if cands[i].score == least]
