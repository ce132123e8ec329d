"""The shared end-to-end system of the multi-mode tests (tests/e2e/test_conversation_e2e.py,
test_openai_surface_e2e.py, test_modes_e2e.py): a real redis-server, multi-mode worker processes over
the demo bundle and one real gateway, started together and torn down together (`Stack`)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai

from specroute.readiness import grpc_serving
from tests.e2e.test_gateway_e2e import ADMIN, _bundle, _http, _spawn, _wait
from tests.redis_server import RedisServer, free_port


class Stack:
    """`workers` worker processes each serving every mode of `modes` (`--engine mtp,dfly,...`), and a
    gateway with one pool per mode whose members are all the workers (`--pool-mode`). The workers write
    their acceptance feedback to the Redis unless `feedback` is off; `worker_args` go to every worker.
    Ready once every worker serves gRPC and the gateway is ready and sees every endpoint of every pool."""

    def __init__(self, tmp: Path, modes: Sequence[str], workers: int = 1, worker_args: Sequence[str] = (),
                 feedback: bool = True) -> None:
        self.redis = RedisServer().start()
        self.worker_ports = [free_port() for _ in range(workers)]
        self.gw_port = free_port()
        self.url = f"http://127.0.0.1:{self.gw_port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            bundle = _bundle(tmp)
            to_redis = ["--redis-url", self.redis.url] if feedback else []
            self.procs = [_spawn(["worker", "--engine", ",".join(modes), "--model", str(bundle), "--port", str(p),
                                  *worker_args, *to_redis], tmp / f"worker{i}.log")
                          for i, p in enumerate(self.worker_ports)]
            for i, p in enumerate(self.worker_ports):
                _wait(lambda a=f"127.0.0.1:{p}": grpc_serving(a), self.procs[i], f"worker {i}", tmp / f"worker{i}.log")
            # the gateway only once the workers serve: a worker measures its machine as it starts (its cost
            # model decides how far rows draft), undisturbed by a gateway loading beside it
            members = ",".join(f"127.0.0.1:{p}" for p in self.worker_ports)
            pools = [x for m in modes for x in ("--pool", f"{m}={members}", "--pool-mode", f"{m}={m}")]
            self.procs.append(_spawn(["gateway", "--port", str(self.gw_port), *pools, "--redis-url", self.redis.url],
                                     tmp / "gw.log", env={"SPECROUTE_ADMIN_TOKEN": f"ops:{ADMIN}"}))
            _wait(lambda: _http(self.url + "/readyz")[0] == 200 and self.pools_up(), self.procs[-1], "gateway",
                  tmp / "gw.log", 120)
        except BaseException:
            self.stop()
            raise
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def admin(self, method: str, path: str, data: Any = None, etag: str | None = None) -> tuple[int, Any, Any]:
        headers = {"authorization": f"Bearer {ADMIN}", **({"if-match": etag} if etag else {})}
        return _http(self.url + path, data, method, headers)

    def pools_up(self) -> bool:
        """Every endpoint of every pool available (the gateway's health loop has seen every worker)."""
        status, pools, _ = self.admin("GET", "/admin/pools")
        return status == 200 and all(p["available_endpoints"] == len(self.worker_ports) for p in pools.values())

    def policy(self, **changes: Any) -> None:
        """Apply `changes` to the live policy document, and give the gateway a moment to take it."""
        _, doc, h = self.admin("GET", "/admin/policy")
        status, body, _ = self.admin("PUT", "/admin/policy", {**doc, **changes}, h["etag"])
        assert status == 200, body
        time.sleep(0.3)

    def pin_chat(self, pool: str) -> None:
        """Chat pinned to `pool`, no exploration, and every other request to the safe pool (uncertainty
        threshold 0)."""
        self.policy(pins={"chat": pool}, exploration_rate=0.0, uncertainty_threshold=0.0)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.redis.stop()
