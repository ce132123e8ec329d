"""Change detection on the learned statistics: a pool that changes stops being judged by its past.

The statistics are exponentially decayed sums (half-life `Policy.half_life_s`, 300 s by default), a
good memory for a steady pool and a slow one for a pool that changes: a drafter that goes bad keeps
most of its good name for minutes, and the policy keeps sending traffic to it. The gateway therefore
keeps what it pulled over the last `drift_window_s` seconds. Because every cell is a decayed sum, the
difference between a cell now and the same cell at an earlier pull, aged to now, is exactly what the
workers reported in between:

    older  = S_then * 0.5 ** (dt / h)          recent = S_now - older      (per field, at least 0)

For each domain x pool (and each pool's global cell) the earlier pull is the latest one since which
at least `drift_min_requests` requests arrived: the newest evidence that is enough to judge, however
busy the cell (a busy cell looks back a second, a quiet one up to the whole window). The cell has
*shifted* when `older` holds as many requests too and the two parts' tokens per verification step
(the mean accepted length: acceptance and the drafts D-Cut still keeps, in one figure) differ by a
factor of `drift_ratio` or more. From then on the cell is judged on what arrived since that pull
alone, and so are the context cells of the same domain and pool: their older evidence predates the
change too, and with little recent evidence of their own they back off to the shifted domain figure
(router/routing/estimate.py). The mark stays while the policy moves traffic away (the evidence since the
change decays, it does not vanish with the window) and is lifted when the pre-change evidence has
decayed below `drift_min_requests` requests, or when it agrees (tokens per step within
`drift_ratio`) with everything since the change or with the newest evidence (a drafter restored, a
load surge over). The global level is tested for itself only, since a change in the traffic mix
moves it without anything being wrong with the pool. Learning counts requests, not tokens, as
evidence (`evidence_per_request`), so this does too.

Pure: no I/O, no clock; the gateway's snapshot (router/state/snapshot.py) supplies the pulls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.routing.estimate import Learning
from specroute.contracts.context import GLOBAL_LEVEL
from specroute.contracts.feedback import STAT_FIELDS, CellStats

Cells = Mapping[tuple[str, str], CellStats]   # (level, pool) -> decayed sums, all aged to one time


def level_domain(level: str) -> str | None:
    """The domain a statistics level belongs to (None for the global level)."""
    if level == GLOBAL_LEVEL:
        return None
    if level.startswith("d="):
        return level[2:].split("|", 1)[0]
    return level


def split(now: CellStats, then: CellStats | None, now_t: float, half_life_s: float) -> tuple[CellStats, CellStats]:
    """(older, recent) parts of `now`: what `then` (a pull of the same cell, earlier) still weighs
    at `now_t`, and what arrived since. A cell that was reset in between has no recent part."""
    if then is None:
        return CellStats(t=now_t), now
    older = then.decayed_to(now_t, half_life_s)
    if now.n < older.n - 1e-9:   # deleted or expired and written again: nothing to compare against
        return CellStats(t=now_t), CellStats(t=now_t)
    recent = {k: max(0.0, getattr(now, k) - getattr(older, k)) for k in STAT_FIELDS}
    return older, CellStats(**recent, t=now_t)


def _apart(a: CellStats, b: CellStats) -> float | None:
    """How far apart two parts' tokens per step are (the larger over the smaller; None without steps)."""
    x, y = a.mean_accepted_length, b.mean_accepted_length
    return None if x is None or y is None else max(x, y) / min(x, y)


def has_shifted(older: CellStats, recent: CellStats, learning: Learning) -> bool:
    """Recent evidence disagrees with the older: enough requests on both sides, and tokens per step
    apart by `drift_ratio` or more."""
    lo = learning.drift_min_requests
    if older.n < lo or recent.n < lo:
        return False
    gap = _apart(older, recent)
    return gap is not None and gap >= learning.drift_ratio


Baselines = Mapping[tuple[str, str], Cells]   # shifted (domain or "*", pool) -> its cells before the change


@dataclass(frozen=True, slots=True)
class DriftView:
    cells: dict[tuple[str, str], CellStats]   # what the policy learns from
    baselines: dict[tuple[str, str], Cells]   # the shifted cells, with their cells before the change

    @property
    def shifted(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.baselines)


def group_of(cell: tuple[str, str]) -> tuple[str, str]:
    """The (domain or "*", pool) a (level, pool) cell is tested and marked with."""
    d = level_domain(cell[0])
    return (GLOBAL_LEVEL if d is None else d, cell[1])


History = Sequence[tuple[float, Cells]]   # earlier pulls (time, cells), oldest first


def adjust(now: Cells, history: History, baselines: Baselines, now_t: float, half_life_s: float,
           learning: Learning) -> DriftView:
    """The cells the policy should learn from (module docstring) and the shifted groups. `now`: the
    cells just pulled; `history`: earlier pulls, each aged to its own time; `baselines`: the previous
    view's."""
    if learning.drift_window_s <= 0:
        return DriftView(dict(now), {})
    lo = learning.drift_min_requests
    marks: dict[tuple[str, str], Cells] = {}
    for group, base in baselines.items():   # keep a mark while the pre-change evidence still disagrees
        head = now.get(group)
        if head is None:
            continue
        before, since = split(head, base.get(group), now_t, half_life_s)
        if before.n < lo or _agree(before, since, learning):
            continue
        newest = _newest(group, head, history, now_t, half_life_s, learning)
        if newest is None or not _agree(before, newest[2], learning):   # not back to what it was
            marks[group] = base
    for cell, s in now.items():
        if cell in marks or cell[0].startswith("d=") or s.n < 2 * lo:
            continue
        newest = _newest(cell, s, history, now_t, half_life_s, learning)
        if newest is not None and has_shifted(newest[1], newest[2], learning):
            marks[cell] = {c: v for c, v in newest[0].items() if group_of(c) == cell}
    if not marks:
        return DriftView(dict(now), {})
    out: dict[tuple[str, str], CellStats] = {}
    for cell, s in now.items():
        base = marks.get(group_of(cell))
        out[cell] = s if base is None else split(s, base.get(cell), now_t, half_life_s)[1]
    return DriftView(out, marks)


def _newest(cell: tuple[str, str], s: CellStats, history: History, now_t: float, half_life_s: float,
            learning: Learning) -> tuple[Cells, CellStats, CellStats] | None:
    """The latest pull within the window since which `drift_min_requests` requests arrived in `cell`,
    with the cell's (older, recent) parts against it; None when there is no such pull."""
    for t, cells in reversed(history):
        if now_t - t > learning.drift_window_s or cell not in cells:
            return None
        older, recent = split(s, cells[cell], now_t, half_life_s)
        if recent.n >= learning.drift_min_requests:
            return cells, older, recent
    return None


def _agree(older: CellStats, since: CellStats, learning: Learning) -> bool:
    """The evidence since a change matches the older again (enough of it, tokens per step within
    `drift_ratio`)."""
    if since.n < learning.drift_min_requests:
        return False
    gap = _apart(older, since)
    return gap is not None and gap < learning.drift_ratio
