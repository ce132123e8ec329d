"""Real worker processes on loopback ports, over a tiny random model bundle."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from specroute.v1 import engine_pb2 as pb
from specroute.v1 import engine_pb2_grpc as pb_grpc
from tests.engines.worker.bundle import tiny_bundle
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Path:
    return tiny_bundle(tmp_path_factory.mktemp("bundle"), drafters=("dfly",))


class Worker:
    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        cmd = [sys.executable, "-m", "specroute.cli", "worker", "--port", str(self.port),
               "--metrics-port", str(self.metrics_port), *args]
        e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=e)
        self.lines: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if "ready on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(120) or self.proc.poll() is not None:
            out = "".join(self.lines)
            self.kill()
            raise RuntimeError(f"worker did not start:\n{out}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.EngineStub(self.channel)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()
        try:
            self.terminate(20)
        except subprocess.TimeoutExpired:
            self.kill()

    def wait_load(self, pred, timeout: float = 30.0) -> pb.LoadResponse:
        t_end = time.monotonic() + timeout
        while True:
            load = self.stub.Load(pb.LoadRequest())
            if pred(load) or time.monotonic() > t_end:
                return load
            time.sleep(0.05)


@pytest.fixture
def start_worker() -> Iterator:
    started: list[Worker] = []

    def start(*args: str, env: dict | None = None) -> Worker:
        w = Worker(*args, env=env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()
