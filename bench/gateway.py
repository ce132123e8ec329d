"""`specroute bench gateway --out bench/results/`: the gateway's own overhead.

One run starts a `null` engine worker (an explicitly named engine that emits tokens without a model,
for overhead measurement only) and one gateway process in front of it, then drives closed-loop
clients at each concurrency level against

- `direct`: the worker's gRPC `Generate` (what the gateway itself does per request: `coalesce` for
  non-streaming requests, the status awaited after the final chunk), and
- `gateway`: `POST /v1/chat/completions` on the gateway (HTTP/1.1 keep-alive, a minimal client so
  the client's own cost stays small), streaming (`stream: true`, read to `[DONE]`) and not.

Short completions (`--max-tokens`, default 8). Client processes are separate from the worker and the
gateway (`--client-procs`). `--tracing` and `--access-log FILE` run the gateway with OpenTelemetry
tracing (no exporter) and the JSON access log on. Writes `gateway.json` (`--name`): `rows` with
`path`, `stream`, `concurrency`, `p50_ms`, `p99_ms`, `requests_per_s` (+ request count and errors)
and the CPU time per request of the gateway and worker processes over the measured window
(`gateway_cpu_us`, `worker_cpu_us`, `client_cpu_us`: on a shared machine a steadier figure than
latency), and
`added_latency` with the gateway-minus-direct p50/p99 per (stream, concurrency).

On a shared machine compare side by side: `--baseline DIR` runs a second gateway from another
checkout (e.g. a `git worktree` of the old commit) beside this one, on the same worker, and each cell
is measured for `direct`, `gateway` and `baseline` back to back (rows with path `baseline`,
`added_latency_baseline`); `--rounds N` repeats every cell N times (alternating the gateways' order)
and the added latency is the median over the rounds of gateway minus direct of the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
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
) -> tuple[list[float], int, float, float, float]:
    import grpc

    from specroute.v1 import engine_pb2, engine_pb2_grpc

    host, port = target.rsplit(":", 1)
    lat: list[float] = []
    errors = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    wall_measure = time.time() + warmup  # where the measured window starts, for the CPU sampler
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

    cpu = [0.0]

    async def cpu_window() -> None:  # this client process's own CPU time over the measured window
        await asyncio.sleep(max(0.0, t_measure - time.perf_counter()))
        c0 = time.process_time()
        await asyncio.sleep(max(0.0, t_end - time.perf_counter()))
        cpu[0] = time.process_time() - c0

    await asyncio.gather(cpu_window(), *(worker() for _ in range(conc)))
    if channel is not None:
        await channel.close()
    return lat, errors, duration, wall_measure, cpu[0]


def _client_proc(args: tuple[Any, ...], out: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    out.put(asyncio.run(_client_loop(*args)))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples the CPU time of some processes every `every_s` (a thread) so that a window's CPU time
    can be read afterwards (`between`); Linux only, else nothing is sampled."""

    def __init__(self, pids: dict[str, int], every_s: float = 0.05) -> None:
        self.pids = {k: v for k, v in pids.items() if os.path.exists(f"/proc/{v}/stat")}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), {k: cpu_seconds(p) for k, p in self.pids.items()}))
            except OSError:
                return
            self._stop.wait(every_s)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds each process used from `t0` to `t1` (nearest samples inside the window)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return {}
        (a_t, a), (b_t, b) = inside[0], inside[-1]
        scale = (t1 - t0) / (b_t - a_t) if b_t > a_t else 0.0
        return {k: (b[k] - a[k]) * scale for k in a}


def run_cell(path: str, stream: bool, conc: int, duration: float, warmup: float, target: str, max_tokens: int,
             procs: int, pids: dict[str, int] | None = None) -> dict[str, Any]:
    """One measured cell; `pids` (name -> process id): processes whose CPU time per request to report."""
    nproc = max(1, min(procs, conc))
    per = [conc // nproc + (1 if i < conc % nproc else 0) for i in range(nproc)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_client_proc, args=((path, stream, c, duration, warmup, target, max_tokens), q))
          for c in per]
    with CpuSampler(pids or {}) as cpu:
        for p in ps:
            p.start()
        results = [q.get(timeout=duration + warmup + 120) for _ in ps]
    for p in ps:
        p.join(10)
    lat = [x for r in results for x in r[0]]
    errors = sum(r[1] for r in results)
    t0 = sum(r[3] for r in results) / len(results)
    used = cpu.between(t0, t0 + duration)
    row = {
        "path": path, "stream": stream, "concurrency": conc,
        "p50_ms": round(percentile(lat, 50) * 1000, 3), "p99_ms": round(percentile(lat, 99) * 1000, 3),
        "requests_per_s": round(len(lat) / duration, 1), "requests": len(lat), "errors": errors,
    }
    used["client"] = sum(r[4] for r in results)
    for name, seconds in used.items():
        row[f"{name}_cpu_us"] = round(seconds / max(1, len(lat)) * 1e6, 1)
    row["load_1m"] = round(os.getloadavg()[0], 2)
    return row


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


def _start_gateway(cli: list[str], worker_addr: str, env: dict[str, str], cwd: str | None,
                   procs: list[subprocess.Popen[bytes]]) -> tuple[int, int]:
    """A gateway on a free port in front of the worker; (pid, port) once it serves."""
    port = free_port()
    g = subprocess.Popen([*cli, "gateway", "--pool", f"null={worker_addr}", "--port", str(port),
                          "--log-level", "warning"], env=env, cwd=cwd, start_new_session=True)
    procs.append(g)
    wait_until(lambda: _gateway_serves(port), g, "gateway")
    return g.pid, port


def added_latency(rows: list[dict[str, Any]], path: str, levels: list[int]) -> list[dict[str, Any]]:
    """`path` minus direct per (stream, concurrency): the median over rounds of each round's difference."""
    cells = {(r["path"], r["stream"], r["concurrency"], r.get("round", 0)): r for r in rows}
    rounds = sorted({r.get("round", 0) for r in rows})
    out = []
    for stream in (False, True):
        for conc in levels:
            pairs = [(cells[(path, stream, conc, n)], cells[("direct", stream, conc, n)]) for n in rounds]
            out.append({"stream": stream, "concurrency": conc,
                        "added_p50_ms": round(statistics.median(g["p50_ms"] - d["p50_ms"] for g, d in pairs), 3),
                        "added_p99_ms": round(statistics.median(g["p99_ms"] - d["p99_ms"] for g, d in pairs), 3),
                        "gateway_requests_per_s": statistics.median(g["requests_per_s"] for g, _ in pairs),
                        "gateway_cpu_us": statistics.median(g.get("gateway_cpu_us") or 0.0 for g, _ in pairs)})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="specroute bench gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/", help="output directory (gateway.json)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--client-procs", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 4)))
    ap.add_argument("--worker", default=None, help="use this running worker HOST:PORT instead of starting one")
    ap.add_argument("--tracing", action="store_true", help="gateway with OpenTelemetry tracing on (no exporter)")
    ap.add_argument("--access-log", metavar="FILE", default=None, help="gateway with the JSON access log into FILE")
    ap.add_argument("--name", default="gateway.json", help="output file name in --out")
    ap.add_argument("--baseline", metavar="DIR", default=None,
                    help="also run the gateway of the checkout in DIR, side by side (path `baseline`)")
    ap.add_argument("--rounds", type=int, default=1, help="measure every cell this many times (median)")
    args = ap.parse_args(argv)
    levels = parse_levels(args.concurrency, "1,16,64")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cli = [sys.executable, "-m", "specroute.cli"]
    procs: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}
    try:
        if args.worker:
            worker_addr = args.worker
        else:
            wport = free_port()
            worker_addr = f"127.0.0.1:{wport}"
            w = subprocess.Popen([*cli, "worker", "--engine", "null", "--port", str(wport), "--max-running", "512",
                                  "--max-waiting", "1024"], start_new_session=True)
            procs.append(w)
            pids["worker"] = w.pid
            wait_until(lambda: grpc_serving(worker_addr), w, "null worker")
        env = {**os.environ, "SPECROUTE_LOG_LEVEL": "warning"}
        env.pop("SPECROUTE_REDIS_URL", None)
        env.pop("REDIS_URL", None)
        for var in ("SPECROUTE_TRACING", "SPECROUTE_TRACE_EXPORTER", "SPECROUTE_ACCESS_LOG", "SPECROUTE_ACCESS_LOG_FILE",
                    "SPECROUTE_ACCESS_LOG_SAMPLE"):
            env.pop(var, None)  # only the flags decide
        if args.tracing:
            env["SPECROUTE_TRACING"] = "true"
        log = Path(args.access_log).resolve() if args.access_log else None
        if log is not None:
            env.update(SPECROUTE_ACCESS_LOG="true", SPECROUTE_ACCESS_LOG_FILE=str(log))
        gateways = {"gateway": _start_gateway(cli, worker_addr, env, None, procs)}
        if args.baseline:
            base = str(Path(args.baseline).resolve())
            benv = {**env, "PYTHONPATH": base}
            if log is not None:
                benv["SPECROUTE_ACCESS_LOG_FILE"] = f"{log}.baseline"
            gateways["baseline"] = _start_gateway(cli, worker_addr, benv, base, procs)

        rows: list[dict[str, Any]] = []
        names = list(gateways)
        for rnd in range(max(1, args.rounds)):
            for stream in (False, True):
                for conc in levels:
                    for path in ["direct", *(names if rnd % 2 == 0 else names[::-1])]:
                        target = worker_addr if path == "direct" else f"127.0.0.1:{gateways[path][1]}"
                        watched = {k: v for k, v in pids.items() if k == "worker"}
                        if path != "direct":
                            watched["gateway"] = gateways[path][0]
                        row = run_cell("direct" if path == "direct" else "gateway", stream, conc, args.duration,
                                       args.warmup, target, args.max_tokens, args.client_procs, watched)
                        row.update(path=path, round=rnd)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        added = added_latency(rows, "gateway", levels)
        result = {
            "benchmark": "gateway",
            "meta": {"engine": "null", "max_tokens": args.max_tokens, "duration_s": args.duration,
                     "client_procs": args.client_procs, "cpu_count": os.cpu_count(), "machine": platform.machine(),
                     "python": platform.python_version(), "time": time.time(), "tracing": args.tracing,
                     "access_log": bool(args.access_log), "rounds": args.rounds,
                     "load_1m_end": round(os.getloadavg()[0], 2)},
            "rows": rows,
            "added_latency": added,
        }
        if args.baseline:
            result["meta"]["baseline"] = args.baseline
            result["added_latency_baseline"] = added_latency(rows, "baseline", levels)
        (out / args.name).write_text(json.dumps(result, indent=2))
        print(json.dumps(added, indent=2))
        print(f"wrote {out / args.name}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return 0
