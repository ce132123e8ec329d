"""specroute/supervisor.py (and serve's helpers) with real child processes: a child that dies is
restarted with backoff while the others run on; stopping is staged and bounded; nothing outlives
the supervisor; serve's Redis keeps acknowledged writes across a kill; the admin token is never
printed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specroute.readiness import free_port, poll_until
from specroute.serve import admin_token, find_redis_server, redis_args, redis_ping
from specroute.supervisor import ChildSpec, ServeSettings, Supervisor, describe_exit, restart_delay

pytestmark = pytest.mark.timeout(60)

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                  "print('ready', flush=True); time.sleep(60)"]


def fast(**kw: float) -> ServeSettings:
    return ServeSettings(**{"restart_backoff_s": 0.05, "restart_backoff_max_s": 0.4, "stable_after_s": 30.0, **kw})


def gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def test_restart_delay_backs_off_and_is_capped() -> None:
    assert [restart_delay(n, 0.5, 15.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(10, 0.5, 15.0) == 15.0 and restart_delay(10**6, 0.5, 15.0) == 15.0
    assert restart_delay(3, 0.0, 15.0) == 0.0
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(3) == "exited with code 3"


def test_a_dead_child_is_restarted_and_the_others_run_on(tmp_path: Path) -> None:
    lines: list[str] = []
    sup = Supervisor(fast(), tmp_path / "status.json", log=lines.append)
    a, b = sup.spawn("a", SLEEP), sup.spawn("b", SLEEP)
    for c in (a, b):
        sup.mark_up(c)
    b_pid, a_pid = b.proc.pid, a.proc.pid
    try:
        os.kill(a_pid, signal.SIGKILL)
        assert poll_until(lambda: (sup.tick(), a.state == "up" and a.proc.pid != a_pid)[1], 10, 0.02)
        assert a.restarts == 1 and a.last_exit == "killed by SIGKILL"
        assert b.proc.pid == b_pid and b.proc.poll() is None and b.state == "up"  # untouched
        status = json.loads((tmp_path / "status.json").read_text())
        assert status["children"]["a"]["state"] == "up" and status["children"]["a"]["restarts"] == 1
        assert status["children"]["a"]["pid"] == a.proc.pid and status["children"]["b"]["restarts"] == 0
        assert any("a killed by SIGKILL; restarting" in x for x in lines) and any("a is back up" in x for x in lines)
    finally:
        sup.stop_all(timeout=5)
    assert a.proc.poll() is not None and b.proc.poll() is not None
    assert json.loads((tmp_path / "status.json").read_text())["children"]["a"]["state"] == "stopped"


def test_a_crash_looping_child_backs_off() -> None:
    sup = Supervisor(fast(restart_backoff_s=0.1, restart_backoff_max_s=0.4), log=lambda _: None)
    crash = sup.spawn("crash", [sys.executable, "-c", "raise SystemExit(3)"])
    sup.mark_up(crash)
    delays: list[float] = []
    t_end = time.monotonic() + 10
    while len(delays) < 4 and time.monotonic() < t_end:
        before = crash.failures
        now = time.monotonic()
        sup.tick(now)
        if crash.failures > before:
            delays.append(round(crash.next_start - now, 3))
        time.sleep(0.01)
    sup.stop_all(timeout=2)
    assert delays == [0.1, 0.2, 0.4, 0.4] and crash.last_exit == "exited with code 3"


def test_a_restart_that_never_gets_ready_is_killed_and_retried() -> None:
    sup = Supervisor(fast(), log=lambda _: None)
    child = sup.add(ChildSpec("hung", SLEEP, ready=lambda: False, start_timeout_s=0.3))
    sup.mark_up(child)
    first = child.proc.pid
    child.proc.kill()
    try:
        assert poll_until(lambda: (sup.tick(), child.restarts >= 2)[1], 10, 0.02)
        assert child.proc.pid != first and child.state in ("starting", "down")
    finally:
        sup.stop_all(timeout=2)


def test_stop_is_staged_bounded_and_forceable() -> None:
    order: list[str] = []
    sup = Supervisor(fast(), log=order.append)
    sup.add(ChildSpec("redis", SLEEP, stage=0))
    sup.add(ChildSpec("worker", SLEEP, stage=1))
    stubborn = sup.add(ChildSpec("gateway", STUBBORN, stage=2))
    time.sleep(0.3)  # the stubborn one has installed its SIGTERM handler
    t0 = time.perf_counter()
    sup.stop_all(timeout=0.5, drain_s=0.3)
    assert 0.7 < time.perf_counter() - t0 < 5  # SIGTERM ignored: killed after drain + timeout
    stops = [x for x in order if x.startswith(("stopping", "killing"))]
    assert stops == ["stopping gateway", "killing gateway", "stopping worker", "stopping redis"]
    assert stubborn.proc.returncode == -signal.SIGKILL
    # a second stop request (force) kills at once
    sup = Supervisor(fast(), log=lambda _: None)
    c = sup.add(ChildSpec("gateway", STUBBORN))
    time.sleep(0.3)
    sup.force = True
    t0 = time.perf_counter()
    sup.stop_all(timeout=30)
    assert time.perf_counter() - t0 < 2 and c.proc.returncode == -signal.SIGKILL


def test_nothing_outlives_the_supervisor() -> None:
    code = ("import sys, time; from specroute.supervisor import Supervisor; "
            "s = Supervisor(log=lambda _: None); c = s.spawn('x', [sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(c.proc.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not gone(child)
        parent.kill()  # SIGKILL: no chance to clean up
        parent.wait(5)
        assert poll_until(lambda: gone(child), 5, 0.05), "the child outlived its supervisor"
    finally:
        parent.kill()


@pytest.mark.skipif(find_redis_server() is None, reason="no redis-server")
def test_serves_redis_keeps_acknowledged_writes_across_a_kill(tmp_path: Path) -> None:
    port = free_port()
    binary = find_redis_server()
    assert binary is not None

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(redis_args(binary, port, tmp_path), stdout=subprocess.DEVNULL)
        assert poll_until(lambda: redis_ping(port), 10, 0.05)
        return p

    def cmd(*parts: str) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall((f"*{len(parts)}\r\n" + "".join(f"${len(x)}\r\n{x}\r\n" for x in parts)).encode())
            return s.recv(100)

    p = start()
    try:
        assert cmd("SET", "specroute:policy", "v7") == b"+OK\r\n"  # acknowledged
        p.kill()
        p.wait(5)
        p = start()
        assert cmd("GET", "specroute:policy") == b"$2\r\nv7\r\n"
    finally:
        p.kill()
        p.wait(5)


def test_admin_token_goes_to_a_private_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("SPECROUTE_ADMIN_TOKEN", "SPECROUTE_ADMIN_TOKENS", "SPECROUTE_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    env, hint = admin_token(tmp_path)
    path = Path(env["SPECROUTE_ADMIN_TOKEN_FILE"])
    token = path.read_text().strip()
    assert len(token) >= 20 and token not in hint and str(path) in hint
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("SPECROUTE_ADMIN_TOKEN", "mine-0123456789abcdef")
    assert admin_token(tmp_path / "other") == ({}, "from your environment")
