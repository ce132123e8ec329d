"""The process supervisor of `specroute serve`: one failure never becomes an outage.

Each child (Redis, a worker, the gateway) is kept running on its own: one that exits is restarted
on the same address after a backoff (`restart_delay`: `restart_backoff_s`, doubling per consecutive
failure up to `restart_backoff_max_s`; a child up for `stable_after_s` starts again from the base),
while the others keep serving. A restarted child counts as back once its readiness probe passes; one
that never gets ready within its start timeout is killed and restarted. Every change of state is a
log line, and the whole picture is written to a JSON status file (`status()`), for people and tests.

Only `stop()` (on Ctrl-C or SIGTERM) stops everything: in stages (the gateway first, which drains
its in-flight streams, then the workers, then Redis), SIGTERM then SIGKILL after each stage's
deadline, or at once when a second Ctrl-C asks for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from specroute.errors import UserError

State = Literal["starting", "up", "down", "stopped"]


class ServeSettings(BaseSettings):
    """Supervision settings of `specroute serve` (environment `SPECROUTE_SERVE_*`)."""

    model_config = SettingsConfigDict(env_prefix="SPECROUTE_SERVE_", extra="ignore")

    restart_backoff_s: float = Field(default=0.5, ge=0, description="wait before the first restart of a child")
    restart_backoff_max_s: float = Field(default=15.0, ge=0, description="longest wait between restarts")
    stable_after_s: float = Field(default=30.0, gt=0, description="a child up this long is healthy again")
    drain_timeout_s: float = Field(default=10.0, ge=0, description="on stop: time for in-flight requests")
    stop_timeout_s: float = Field(default=10.0, gt=0, description="on stop: time per stage after the drain")
    poll_interval_s: float = Field(default=0.2, gt=0)


def restart_delay(failures: int, base_s: float, max_s: float) -> float:
    """Seconds to wait before restarting a child after its `failures`-th consecutive failure (1 = the
    first): `base_s`, then doubling, never more than `max_s`."""
    return float(min(max_s, base_s * 2 ** max(0, min(failures, 64) - 1)))


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with code {code}"


def say(msg: str) -> None:
    """A status line on stderr; a closed stderr (e.g. `| tee` killed by the same Ctrl-C) must never
    keep the supervisor from stopping the children."""
    with contextlib.suppress(OSError):
        print(f"specroute serve: {msg}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM if `specroute serve` itself dies (even by SIGKILL), so no
    worker or Redis outlives it."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class ChildSpec:
    name: str
    args: list[str]
    ready: Callable[[], object] = lambda: True  # readiness probe: truthy (exceptions count as "not yet")
    env: dict[str, str] = field(default_factory=dict)
    address: str = ""
    stage: int = 0  # stop order: the highest stage stops first
    start_timeout_s: float = 120.0
    log: IO[bytes] | None = None  # None: inherit our stdout/stderr
    quiet: bool = False


@dataclass
class Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes]
    state: State = "starting"
    started_at: float = 0.0  # monotonic time of the current process's start
    up_at: float | None = None
    down_at: float | None = None
    failures: int = 0  # consecutive failures (reset once up for `stable_after_s`)
    restarts: int = 0
    next_start: float = 0.0
    last_exit: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Supervisor:
    settings: ServeSettings = field(default_factory=ServeSettings)
    status_file: Path | None = None
    log: Callable[[str], None] = say
    children: list[Child] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # extra fields of the status file (addresses)
    stopping: bool = False
    force: bool = False  # a second stop request: kill what is left at once

    # -- starting ----------------------------------------------------------------------------------
    def _popen(self, spec: ChildSpec) -> subprocess.Popen[bytes]:
        out: Any = subprocess.DEVNULL if spec.quiet else spec.log
        return subprocess.Popen(
            spec.args, env={**os.environ, **spec.env}, stdout=out, stderr=subprocess.STDOUT if out else None,
            start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509 - single-threaded
        )

    def add(self, spec: ChildSpec) -> Child:
        child = Child(spec, self._popen(spec), started_at=time.monotonic())
        self.children.append(child)
        self.write_status()
        return child

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> Child:
        return self.add(ChildSpec(name, args, env=dict(env or {}), quiet=quiet))

    def check_alive(self) -> None:
        """Raise if a child exited (while everything is first started: a broken setup should fail
        fast, with the child's own log above, rather than restart forever)."""
        if self.force or self.stopping:
            raise KeyboardInterrupt
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                raise UserError(f"{c.name} {describe_exit(code)} while starting (see its log above)")

    def mark_up(self, child: Child) -> None:
        child.state, child.up_at = "up", time.monotonic()
        self.write_status()

    # -- keeping them running ------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """One round of supervision: notice exits, restart what is due, promote children whose
        probe passes, reset the failure count of stable ones."""
        now = time.monotonic() if now is None else now
        changed = False
        s = self.settings
        for c in self.children:
            if self.stopping:
                return
            code = c.proc.poll() if c.state in ("starting", "up") else None
            if code is not None:
                c.failures += 1
                c.state, c.down_at, c.last_exit = "down", now, describe_exit(code)
                delay = restart_delay(c.failures, s.restart_backoff_s, s.restart_backoff_max_s)
                c.next_start = now + delay
                self.log(f"{c.name} {c.last_exit}; restarting in {delay:.1f} s "
                         f"(restart {c.restarts + 1}; the rest keep serving)")
                changed = True
            elif c.state == "down" and now >= c.next_start:
                c.proc = self._popen(c.spec)
                c.state, c.started_at, c.up_at = "starting", now, None
                c.restarts += 1
                self.log(f"{c.name} restarted (pid {c.proc.pid})")
                changed = True
            elif c.state == "starting" and c.restarts:
                if _probe(c.spec.ready):
                    c.state, c.up_at = "up", now
                    gap = f", {now - c.down_at:.1f} s after it went down" if c.down_at is not None else ""
                    self.log(f"{c.name} is back up (pid {c.proc.pid}){gap}")
                    changed = True
                elif now - c.started_at > c.spec.start_timeout_s:
                    self.log(f"{c.name} not ready {c.spec.start_timeout_s:.0f} s after its restart; killing it")
                    with contextlib.suppress(ProcessLookupError):
                        c.proc.kill()
            elif c.state == "up" and c.failures and c.up_at is not None and now - c.up_at >= s.stable_after_s:
                c.failures = 0
        if changed:
            self.write_status()

    def status(self) -> dict[str, Any]:
        """Every child's state, pid, restarts and last exit (what the status file holds)."""
        now_m, now = time.monotonic(), time.time()

        def wall(t: float | None) -> float | None:
            return None if t is None else round(now - (now_m - t), 3)

        return {
            **self.info,
            "pid": os.getpid(),
            "updated": now,
            "stopping": self.stopping,
            "children": {
                c.name: {"state": c.state, "pid": c.proc.pid, "address": c.spec.address, "restarts": c.restarts,
                         "last_exit": c.last_exit, "up_since": wall(c.up_at), "down_since": wall(c.down_at)}
                for c in self.children
            },
        }

    def write_status(self) -> None:
        if self.status_file is None:
            return
        tmp = self.status_file.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.status(), indent=1))
            os.replace(tmp, self.status_file)

    # -- stopping ------------------------------------------------------------------------------------
    def stop_all(self, timeout: float | None = None, drain_s: float = 0.0) -> None:
        """Stop every child, highest stage first: SIGTERM, then SIGKILL after `drain_s` + `timeout`
        seconds (each stage may drain its in-flight work), or at once once `force` is set."""
        self.stopping = True
        timeout = self.settings.stop_timeout_s if timeout is None else timeout
        for stage in sorted({c.spec.stage for c in self.children}, reverse=True):
            group = [c for c in self.children if c.spec.stage == stage and c.proc.poll() is None]
            self._stop_group(group, drain_s + timeout)
        for c in self.children:
            c.state = "stopped"
        self.write_status()

    def _stop_group(self, group: Sequence[Child], deadline_s: float) -> None:
        for c in group:
            self.log(f"stopping {c.name}")
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + deadline_s
        while any(c.proc.poll() is None for c in group):
            if self.force or time.monotonic() > end:
                for c in group:
                    if c.proc.poll() is None:
                        self.log(f"killing {c.name}")
                        with contextlib.suppress(ProcessLookupError):
                            c.proc.kill()
                for c in group:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        c.proc.wait(5)
                return
            time.sleep(0.05)


def _probe(check: Callable[[], object]) -> bool:
    try:
        return bool(check())
    except Exception:
        return False
