"""The one acceptance-statistics record and its formula, used by the engine (per slot, per request,
per generation), the feedback path (one record per finished request) and the benchmarks.

Convention (vLLM's): a verification step emits the accepted drafts plus one token of the target's
own (the bonus or correction), so tokens per step = 1 + accepted / steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLAIN = "plain"   # `steps_by`'s key of a step that verified no drafts (no drafter, or D-Cut kept none)


def mean_accepted_length(accepted: float, steps: float) -> float | None:
    """Tokens emitted per verification step, bonus included; None when there were no steps."""
    return 1.0 + accepted / steps if steps > 0 else None


@dataclass(slots=True)
class AcceptanceStats:
    """Drafts verified and accepted over a number of verification steps.

    `accepted_per_position[i]` counts the steps that accepted draft i+1 (so it never increases
    with i); an AR engine has steps > 0 and nothing drafted. `steps_by` counts the steps by what
    drafted them: a drafter's kind (`mtp`, `dfly`, ...) or `PLAIN` (a step that verified no drafts).
    It tells which drafter actually served a request on a worker whose rows may draft with another
    mode's drafter than their own, or none (engines/modes.py); steps recorded without a name (an
    engine that cannot tell, e.g. vLLM's) are not in it."""

    drafted: int = 0   # draft tokens sent to verification (after D-Cut)
    accepted: int = 0  # draft tokens accepted (bonus excluded)
    steps: int = 0     # verification steps (target forwards after prefill)
    accepted_per_position: list[int] = field(default_factory=list)
    steps_by: dict[str, int] = field(default_factory=dict)

    def record_step(self, drafted: int, accepted: int, by: str | None = None) -> None:
        """Add one verification step that kept `drafted` drafts and accepted the first `accepted`;
        `by`: the kind of the drafter that drafted them (a step that kept none counts as `PLAIN`)."""
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        if by is not None:
            key = by if drafted > 0 else PLAIN
            self.steps_by[key] = self.steps_by.get(key, 0) + 1
        width = max(drafted, accepted)
        if width > len(self.accepted_per_position):
            self.accepted_per_position.extend([0] * (width - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def merge(self, other: AcceptanceStats) -> AcceptanceStats:
        """Sum of two records (a new object)."""
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        per = [0] * n
        for src in (self.accepted_per_position, other.accepted_per_position):
            for i, v in enumerate(src):
                per[i] += v
        by = dict(self.steps_by)
        for k, v in other.steps_by.items():
            by[k] = by.get(k, 0) + v
        return AcceptanceStats(self.drafted + other.drafted, self.accepted + other.accepted,
                               self.steps + other.steps, per, by)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification step, bonus included; 0.0 before the first step."""
        return mean_accepted_length(self.accepted, self.steps) or 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted drafts; None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted > 0 else None

    def acceptance_per_position(self) -> list[float]:
        """Fraction of steps accepting draft i+1, for each position seen."""
        return [v / self.steps for v in self.accepted_per_position] if self.steps else []
