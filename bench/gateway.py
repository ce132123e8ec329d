"""`specroute bench gateway --out bench/results/`: the gateway's own overhead.

One run starts a `null` engine worker (an explicitly named engine that emits tokens without a model,
for overhead measurement only) and one gateway process in front of it, then drives closed-loop
clients at each concurrency level against

- `direct`: the worker's gRPC `Generate` (what the gateway itself does per request: `coalesce` for
  non-streaming requests, the status awaited after the final chunk), and
- `gateway`: `POST /v1/chat/completions` on the gateway (HTTP/1.1 keep-alive, a minimal client so
  the client's own cost stays small), streaming (`stream: true`, read to `[DONE]`) and not.

Short completions (`--max-tokens`, default 8). Client processes are separate from the worker and the
gateway (`--client-procs`). Writes `gateway.json`: `rows` with `path`, `stream`, `concurrency`,
`p50_ms`, `p99_ms`, `requests_per_s` (+ request count and errors), and `added_latency` with the
gateway-minus-direct p50/p99 per (stream, concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import KeepAliveConn, parse_levels, read_chunks, read_head
from specroute.errors import UserError
from specroute.readiness import free_port, grpc_serving, poll_until

PROMPT = "Say something short."


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    i = min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))
    return s[i]


# ---------------------------------------------------------------------------------------------
# clients (run inside client processes)


class HTTPConn(KeepAliveConn):
    """Minimal HTTP/1.1 keep-alive client: POST JSON, read a Content-Length or chunked body."""

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        reader = await self.send(path, body)
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        head = await read_head(reader)
        data = bytearray()
        if head.chunked:
            async for chunk in read_chunks(reader):
                data += chunk
        elif head.length is not None:
            data += await reader.readexactly(head.length)
        if head.close:
            self.close()
        return status, bytes(data)


async def _client_loop(
    path: str, stream: bool, conc: int, duration: float, warmup: float, target: str, max_tokens: int,
) -> tuple[list[float], int, float]:
    import grpc

    from specroute.v1 import engine_pb2, engine_pb2_grpc

    host, port = target.rsplit(":", 1)
    lat: list[float] = []
    errors = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + duration
    body = json.dumps({"model": "specroute", "messages": [{"role": "user", "content": PROMPT}],
                       "max_tokens": max_tokens, "temperature": 0, "stream": stream}).encode()
    channel = grpc.aio.insecure_channel(target) if path == "direct" else None
    stub = engine_pb2_grpc.EngineStub(channel) if channel is not None else None

    async def one_direct() -> bool:
        assert stub is not None
        # the same request the gateway sends: non-streaming asks the worker to coalesce its chunks
        req = engine_pb2.GenerateRequest(max_tokens=max_tokens, domain="chat", pool="null", coalesce=not stream)
        req.messages.add(role="user", content=PROMPT)
        call = stub.Generate(req, timeout=30)
        while True:  # like the gateway: read to the final chunk, then wait for the status
            chunk = await call.read()
            if chunk is grpc.aio.EOF:
                return False
            if chunk.finish_reason:
                return bool(await call.code() == grpc.StatusCode.OK)

    async def worker() -> None:
        nonlocal errors
        conn = HTTPConn(host, int(port))
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            try:
                if path == "direct":
                    ok = await one_direct()
                else:
                    status, data = await conn.post("/v1/chat/completions", body)
                    ok = status == 200 and (b"[DONE]" in data if stream else b'"choices"' in data)
            except Exception:
                ok = False
                conn = HTTPConn(host, int(port))
            t1 = time.perf_counter()
            if t0 >= t_measure and t1 <= t_end:
                if ok:
                    lat.append(t1 - t0)
                else:
                    errors += 1

    await asyncio.gather(*(worker() for _ in range(conc)))
    if channel is not None:
        await channel.close()
    return lat, errors, duration


def _client_proc(args: tuple[Any, ...], out: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    out.put(asyncio.run(_client_loop(*args)))


def run_cell(path: str, stream: bool, conc: int, duration: float, warmup: float, target: str, max_tokens: int,
             procs: int) -> dict[str, Any]:
    nproc = max(1, min(procs, conc))
    per = [conc // nproc + (1 if i < conc % nproc else 0) for i in range(nproc)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_client_proc, args=((path, stream, c, duration, warmup, target, max_tokens), q))
          for c in per]
    for p in ps:
        p.start()
    results = [q.get(timeout=duration + warmup + 120) for _ in ps]
    for p in ps:
        p.join(10)
    lat = [x for r in results for x in r[0]]
    errors = sum(r[1] for r in results)
    return {
        "path": path, "stream": stream, "concurrency": conc,
        "p50_ms": round(percentile(lat, 50) * 1000, 3), "p99_ms": round(percentile(lat, 99) * 1000, 3),
        "requests_per_s": round(len(lat) / duration, 1), "requests": len(lat), "errors": errors,
    }


# ---------------------------------------------------------------------------------------------
# orchestration


def wait_until(check: Any, proc: subprocess.Popen[bytes], what: str, timeout: float = 120.0) -> None:
    def alive() -> None:
        if proc.poll() is not None:
            raise UserError(f"{what} exited with code {proc.returncode}")

    if not poll_until(check, timeout, 0.2, alive):
        raise UserError(f"{what} not ready after {timeout}s")


def _gateway_serves(port: int) -> bool:
    """A real request goes through (readiness without insisting on the classifier artifact)."""
    status, _ = asyncio.run(HTTPConn("127.0.0.1", port).post("/v1/chat/completions", json.dumps(
        {"model": "specroute", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}).encode()))
    return status == 200


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/", help="output directory (gateway.json)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--client-procs", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 4)))
    ap.add_argument("--worker", default=None, help="use this running worker HOST:PORT instead of starting one")
    args = ap.parse_args(argv)
    levels = parse_levels(args.concurrency, "1,16,64")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cli = [sys.executable, "-m", "specroute.cli"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if args.worker:
            worker_addr = args.worker
        else:
            wport = free_port()
            worker_addr = f"127.0.0.1:{wport}"
            w = subprocess.Popen([*cli, "worker", "--engine", "null", "--port", str(wport), "--max-running", "512",
                                  "--max-waiting", "1024"], start_new_session=True)
            procs.append(w)
            wait_until(lambda: grpc_serving(worker_addr), w, "null worker")
        gport = free_port()
        env = {**os.environ, "SPECROUTE_LOG_LEVEL": "warning"}
        env.pop("SPECROUTE_REDIS_URL", None)
        env.pop("REDIS_URL", None)
        g = subprocess.Popen([*cli, "gateway", "--pool", f"null={worker_addr}", "--port", str(gport),
                              "--log-level", "warning"], env=env, start_new_session=True)
        procs.append(g)
        wait_until(lambda: _gateway_serves(gport), g, "gateway")

        rows: list[dict[str, Any]] = []
        for stream in (False, True):
            for conc in levels:
                for path, target in (("direct", worker_addr), ("gateway", f"127.0.0.1:{gport}")):
                    row = run_cell(path, stream, conc, args.duration, args.warmup, target, args.max_tokens,
                                   args.client_procs)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        added = []
        for stream in (False, True):
            for conc in levels:
                d = next(r for r in rows if r["path"] == "direct" and r["stream"] == stream and r["concurrency"] == conc)
                gw = next(r for r in rows if r["path"] == "gateway" and r["stream"] == stream and r["concurrency"] == conc)
                added.append({"stream": stream, "concurrency": conc,
                              "added_p50_ms": round(gw["p50_ms"] - d["p50_ms"], 3),
                              "added_p99_ms": round(gw["p99_ms"] - d["p99_ms"], 3),
                              "gateway_requests_per_s": gw["requests_per_s"]})
        result = {
            "benchmark": "gateway",
            "meta": {"engine": "null", "max_tokens": args.max_tokens, "duration_s": args.duration,
                     "client_procs": args.client_procs, "cpu_count": os.cpu_count(), "machine": platform.machine(),
                     "python": platform.python_version(), "time": time.time()},
            "rows": rows,
            "added_latency": added,
        }
        (out / "gateway.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(added, indent=2))
        print(f"wrote {out / 'gateway.json'}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return 0
