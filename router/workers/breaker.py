"""A circuit breaker, pure (the clock is passed in).

Closed while fewer than `threshold` failures happened in a row. Open for `cooldown_s` after the
threshold is reached: nothing may go through. Then half-open: exactly one trial request may go
through (`acquire` takes it), and its outcome closes the breaker (`success`) or opens it again for
another cooldown (`failure`); a trial that ends without an outcome (`release`) frees the next one.
"""

from __future__ import annotations


class Breaker:
    __slots__ = ("threshold", "cooldown_s", "failures", "open_until", "trial")

    def __init__(self, threshold: int, cooldown_s: float) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.failures = 0          # in a row
        self.open_until = 0.0      # clock time the cooldown ends
        self.trial = False         # the half-open breaker's one trial request is in flight

    def allows(self, now: float) -> bool:
        """Whether a new request may go through: closed, or half-open with its trial not yet taken."""
        if self.failures < self.threshold:
            return True
        return now >= self.open_until and not self.trial

    def state(self, now: float) -> str:
        if self.failures < self.threshold:
            return "closed"
        return "open" if now < self.open_until else "half_open"

    def acquire(self) -> bool:
        """A request starts; whether it is the half-open breaker's trial."""
        if self.failures >= self.threshold:
            self.trial = True
            return True
        return False

    def release(self, trial: bool) -> None:
        if trial:
            self.trial = False

    def success(self) -> None:
        self.failures = 0
        self.open_until = 0.0
        self.trial = False

    def failure(self, now: float) -> None:
        self.failures += 1
        if self.failures >= self.threshold:
            self.open_until = now + self.cooldown_s
            self.trial = False
