"""Which endpoint of a pool takes a request: the least loaded, and among those about as idle, the one
whose worker runs fewest rows of the other batch kind (batch affinity).

A worker verifies all its rows in one step, and whether drafting pays is a property of the whole
batch: a step whose rows are all hot (`RequestContext.batch`, the `high` temperature bucket) may go
plain, but one cool row keeps it drafting. So each worker counts its in-flight rows per batch kind
(`router.workers.endpoint.WorkerLoad`, over every pool it serves), and among the endpoints whose load
is within `slack` rows of the least loaded, those with the fewest rows of the other kind, and of
them the least loaded, take the request. `slack` bounds the balance given up: 0 is plain
least-loaded balancing, and so is traffic of one kind. Measurements: `bench/results/routing-affinity*.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    score: float     # load, as a fraction of the endpoint's capacity (`Endpoint.score`)
    row: float       # what one row adds to `score` (1 / capacity)
    same: int = 0    # in-flight rows of the request's batch kind on the endpoint's worker
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
