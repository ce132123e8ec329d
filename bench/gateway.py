"""`specroute bench gateway --out bench/results/`: the gateway's own cost, CPU and latency.

One run starts a `null` engine worker (an explicitly named engine that emits tokens without a model,
for overhead measurement only) and one gateway process in front of it (a second, `--baseline DIR`,
from another checkout, on the same worker), and measures per cell (stream or not x concurrency)

- `direct`: the worker's gRPC calls as the gateway makes them (the unary `Complete` for a
  non-streaming request, the `Generate` stream otherwise), and
- `gateway` (and `baseline`): `POST /v1/chat/completions` (HTTP/1.1 keep-alive, a minimal client);
- with `--floor`, `floor` and `floor-classify`: the same requests to bench/gateway_floor.py, the
  gateway's HTTP server and worker call with no product logic, without and with the classifier.

Requests carry held-out prompts of every length (`prompts/*.jsonl` of `SPECROUTE_DATA_DIR`, else
`../shared/data`; tests point it at `tests/data`), each request key (client process, slot, number)
the same prompt on every path. Clients are closed-loop (`--concurrency` requests in flight) or
open-loop (`--arrival open`: Poisson arrivals at `--rate` requests per second, latency counted from
the scheduled arrival). The CPU time of the gateway process over the measured window, per request
(`gateway_cpu_us`), is steadier than latency on a shared machine. Added latency is per request: a
gateway request minus the direct request of the same key in the same round (bench/gateway_stats.py).

`--rounds N` measures every cell N times, the paths' order alternating. Writes `gateway.json` (`--name`:
rows, `summary` per path and cell, `comparison` against the baseline) and, with `--baseline`,
`gateway-cpu.json` (`--cpu-name`): `gateway_cpu_us`, `baseline_cpu_us`, their ratio per round with a
bootstrap 95% interval, and the paired latency difference, per (stream, concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import KeepAliveConn, parse_levels, read_chunks, read_head
from bench.gateway_stats import Key, cell_summary, comparison
from specroute.errors import UserError
from specroute.readiness import free_port, grpc_serving, poll_until

WARM_PROMPT = "Say something short."
PATHS_UNARY = {False: True, True: False}   # stream -> whether the direct path calls the unary `Complete`
# bench/gateway_floor.py without and with `--classify`: path -> its fields' prefix in gateway-cpu.json,
# and the floor app's flags
FLOORS = {"floor": ("floor", []), "floor-classify": ("floor_classify", ["--classify"])}


def data_root() -> Path:
    """`SPECROUTE_DATA_DIR`, else `../shared/data` beside the repository."""
    env = os.environ.get("SPECROUTE_DATA_DIR")
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (root / "prompts").is_dir():
        raise UserError(f"no held-out prompts at {root}/prompts: set SPECROUTE_DATA_DIR to a data folder "
                        "or place one at ../shared/data beside the repository")
    return root


def load_prompts(root: Path, seed: int = 0) -> list[str]:
    """Every held-out prompt of `root`, of every length, in a seeded order."""
    from bench.routing_trace import read_prompts

    texts = [p.text for p in read_prompts(root, max_chars=1 << 20)]
    if not texts:
        raise UserError(f"no held-out prompts in {root}/prompts")
    random.Random(seed).shuffle(texts)
    return texts


@dataclass(frozen=True)
class Load:
    """What one client process sends: closed-loop `slots` in flight, or open-loop at `rate` per s."""

    path: str           # "direct" or "gateway"
    stream: bool
    slots: int          # closed loop: requests in flight (open loop: 0)
    rate: float         # open loop: arrivals per second (closed loop: 0)
    duration: float
    warmup: float
    target: str
    max_tokens: int
    proc: int           # this client process's index (part of every request key)
    procs: int
    seed: int = 0


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


class Client:
    """One request of a key, on the path of `load` (the prompt of a key is the same on every path)."""

    def __init__(self, load: Load, prompts: list[str]) -> None:
        import grpc

        from specroute.v1 import engine_pb2, engine_pb2_grpc

        self.load, self.prompts, self.grpc, self.pb = load, prompts, grpc, engine_pb2
        self.channel = grpc.aio.insecure_channel(load.target) if load.path == "direct" else None
        self.stub = engine_pb2_grpc.EngineStub(self.channel) if self.channel is not None else None
        self.host, port = load.target.rsplit(":", 1)
        self.port = int(port)
        self.idle: list[HTTPConn] = []

    def prompt(self, key: Key) -> str:
        proc, slot, n = key
        return self.prompts[(proc * 7919 + slot * 104729 + n) % len(self.prompts)]

    async def one(self, key: Key) -> bool:
        text = self.prompt(key)
        if self.stub is not None:
            return await self._direct(text)
        conn = self.idle.pop() if self.idle else HTTPConn(self.host, self.port)
        body = json.dumps({"model": "specroute", "messages": [{"role": "user", "content": text}],
                           "max_tokens": self.load.max_tokens, "temperature": 0, "stream": self.load.stream}).encode()
        try:
            status, data = await conn.post("/v1/chat/completions", body)
        except Exception:
            return False
        self.idle.append(conn)
        return status == 200 and (b"[DONE]" in data if self.load.stream else b'"choices"' in data)

    async def _direct(self, text: str) -> bool:
        assert self.stub is not None
        grpc, pb = self.grpc, self.pb
        # the request the gateway sends: unary when not streaming, the status awaited after the final chunk
        req = pb.GenerateRequest(max_tokens=self.load.max_tokens, domain="chat", pool="null",
                                 coalesce=not self.load.stream, temperature_bucket="0")
        req.messages.add(role="user", content=text)
        if PATHS_UNARY[self.load.stream]:
            return bool((await self.stub.Complete(req, timeout=30)).finish_reason)
        call = self.stub.Generate(req, timeout=30)
        while True:
            chunk = await call.read()
            if chunk is grpc.aio.EOF:
                return False
            if chunk.finish_reason:
                return bool(await call.code() == grpc.StatusCode.OK)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()


async def _client_loop(load: Load, prompts: list[str]) -> tuple[dict[Key, float], int, float, float]:
    """(latency of each measured request that succeeded, errors, start of the measured window (wall
    clock), this process's CPU seconds over it)."""
    client = Client(load, prompts)
    lat: dict[Key, float] = {}
    errors = 0
    t_measure = time.perf_counter() + load.warmup
    wall_measure = time.time() + load.warmup
    t_end = t_measure + load.duration

    async def request(key: Key, t0: float) -> None:
        nonlocal errors
        ok = await client.one(key)
        t1 = time.perf_counter()
        if t0 >= t_measure and t1 <= t_end:
            if ok:
                lat[key] = t1 - t0
            else:
                errors += 1

    async def slot(i: int) -> None:
        n = 0
        while (t0 := time.perf_counter()) < t_end:
            await request((load.proc, i, n), t0)
            n += 1

    async def arrivals() -> None:
        rng, tasks, n = random.Random(load.seed * 1000 + load.proc), set(), 0
        t = time.perf_counter()
        while (t := t + rng.expovariate(load.rate)) < t_end:
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            task = asyncio.create_task(request((load.proc, 0, n), t))   # latency from the scheduled arrival
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks)

    cpu = [0.0]

    async def cpu_window() -> None:  # this client process's own CPU time over the measured window
        await asyncio.sleep(max(0.0, t_measure - time.perf_counter()))
        c0 = time.process_time()
        await asyncio.sleep(max(0.0, t_end - time.perf_counter()))
        cpu[0] = time.process_time() - c0

    drivers = [arrivals()] if load.rate > 0 else [slot(i) for i in range(load.slots)]
    await asyncio.gather(cpu_window(), *drivers)
    await client.close()
    return lat, errors, wall_measure, cpu[0]


def _client_proc(load: Load, prompts: list[str], out: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    out.put(asyncio.run(_client_loop(load, prompts)))


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


def run_cell(cell: Load, prompts: list[str], pids: dict[str, int] | None = None
             ) -> tuple[dict[str, Any], dict[Key, float]]:
    """One measured cell over `cell.procs` client processes (closed loop: `cell.slots` in flight in all;
    open loop: `cell.rate` per second in all); `pids` (name -> process id): processes whose CPU time per
    request to report. Returns the row and the latency of each request key."""
    nproc = max(1, min(cell.procs, cell.slots or cell.procs))
    loads = [Load(cell.path, cell.stream, cell.slots // nproc + (1 if i < cell.slots % nproc else 0),
                  cell.rate / nproc, cell.duration, cell.warmup, cell.target, cell.max_tokens, i, nproc, cell.seed)
             for i in range(nproc)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_client_proc, args=(ld, prompts, q)) for ld in loads]
    with CpuSampler(pids or {}) as sampler:
        for p in ps:
            p.start()
        results = [q.get(timeout=cell.duration + cell.warmup + 120) for _ in ps]
    for p in ps:
        p.join(10)
    lat = {k: v for r in results for k, v in r[0].items()}
    t0 = sum(r[2] for r in results) / len(results)
    used = sampler.between(t0, t0 + cell.duration)
    xs = sorted(lat.values())
    row: dict[str, Any] = {
        "path": cell.path, "stream": cell.stream, "concurrency": cell.slots, "rate": cell.rate,
        "p50_ms": round(xs[len(xs) // 2] * 1000, 3) if xs else None,
        "p99_ms": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000, 3) if xs else None,
        "requests_per_s": round(len(xs) / cell.duration, 1), "requests": len(xs),
        "errors": sum(r[1] for r in results),
    }
    used["client"] = sum(r[3] for r in results)
    for name, seconds in used.items():
        row[f"{name}_cpu_us"] = round(seconds / max(1, len(xs)) * 1e6, 1)
    row["load_1m"] = round(os.getloadavg()[0], 2)
    return row, lat


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
        {"model": "specroute", "messages": [{"role": "user", "content": WARM_PROMPT}], "max_tokens": 2}).encode()))
    return status == 200


def _start_gateway(cli: list[str], worker_addr: str, env: dict[str, str], cwd: str | None,
                   procs: list[subprocess.Popen[bytes]], floor: list[str] | None = None) -> tuple[int, int]:
    """A gateway (`floor`: the floor app with these flags) on a free port in front of the worker; (pid,
    port) once it serves."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.gateway_floor", "--port", str(port), "--worker", worker_addr, *floor] \
        if floor is not None else \
        [*cli, "gateway", "--pool", f"null={worker_addr}", "--port", str(port), "--log-level", "warning"]
    g = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True)
    procs.append(g)
    wait_until(lambda: _gateway_serves(port), g, "gateway")
    return g.pid, port


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specroute bench gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/", help="output directory")
    ap.add_argument("--concurrency", default="1,16,64", help="closed loop: requests in flight per cell")
    ap.add_argument("--arrival", choices=("closed", "open"), default="closed")
    ap.add_argument("--rate", default="50,200", help="open loop: arrivals per second per cell")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--client-procs", type=int, default=max(1, min(4, (os.cpu_count() or 2) // 4)))
    ap.add_argument("--worker", default=None, help="use this running worker HOST:PORT instead of starting one")
    ap.add_argument("--tracing", action="store_true", help="gateway with OpenTelemetry tracing on (no exporter)")
    ap.add_argument("--access-log", metavar="FILE", default=None, help="gateway with the JSON access log into FILE")
    ap.add_argument("--name", default="gateway.json", help="output file name in --out")
    ap.add_argument("--cpu-name", default="gateway-cpu.json", help="the headline CPU comparison's file (with --baseline)")
    ap.add_argument("--baseline", metavar="DIR", default=None,
                    help="also run the gateway of the checkout in DIR, side by side (path `baseline`)")
    ap.add_argument("--floor", action="store_true",
                    help="also run the floor (bench/gateway_floor.py: the gateway's stack, no product logic) and "
                         "the floor that classifies, side by side (paths `floor` and `floor-classify`)")
    ap.add_argument("--rounds", type=int, default=1, help="measure every cell this many times")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def _environment(args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "SPECROUTE_LOG_LEVEL": "warning"}
    for var in ("SPECROUTE_REDIS_URL", "REDIS_URL", "SPECROUTE_TRACING", "SPECROUTE_TRACE_EXPORTER",
                "SPECROUTE_ACCESS_LOG", "SPECROUTE_ACCESS_LOG_FILE", "SPECROUTE_ACCESS_LOG_SAMPLE"):
        env.pop(var, None)  # only the flags decide
    if args.tracing:
        env["SPECROUTE_TRACING"] = "true"
    if args.access_log:
        env.update(SPECROUTE_ACCESS_LOG="true", SPECROUTE_ACCESS_LOG_FILE=str(Path(args.access_log).resolve()))
    return env


def _measure(args: argparse.Namespace, worker_addr: str, gateways: dict[str, tuple[int, int]],
             pids: dict[str, int], prompts: list[str]) -> list[tuple[dict[str, Any], dict[Key, float]]]:
    """Every cell of every round, the paths of a cell back to back (their order alternating by round)."""
    open_loop = args.arrival == "open"
    levels = [float(x) for x in args.rate.replace(",", " ").split()] if open_loop else \
        parse_levels(args.concurrency, "1,16,64")
    names = list(gateways)
    out: list[tuple[dict[str, Any], dict[Key, float]]] = []
    for rnd in range(max(1, args.rounds)):
        for stream in (False, True):
            for level in levels:
                for path in ["direct", *(names if rnd % 2 == 0 else names[::-1])]:
                    target = worker_addr if path == "direct" else f"127.0.0.1:{gateways[path][1]}"
                    watched = {k: v for k, v in pids.items() if k == "worker"}
                    if path != "direct":
                        watched["gateway"] = gateways[path][0]
                    cell = Load("direct" if path == "direct" else "gateway", stream, 0 if open_loop else int(level),
                                level if open_loop else 0.0, args.duration, args.warmup, target, args.max_tokens,
                                0, args.client_procs, args.seed + rnd)
                    row, lat = run_cell(cell, prompts, watched)
                    row.update(path=path, round=rnd)
                    out.append((row, lat))
                    print(json.dumps(row), flush=True)
    return out


def route_input_costs(prompts: list[str], reps: int = 3) -> dict[str, float]:
    """Mean microseconds per prompt, in this process, of the two things the gateway derives from every
    request's text before deciding: the classifier and the routing features (median over `reps`)."""
    from classifier import classify
    from router.routing.features import prompt_features

    sample = prompts[:2000]
    messages = [[{"role": "user", "content": t}] for t in sample]
    stages = {"classify": lambda i: classify(messages[i]), "prompt_features": lambda i: prompt_features([sample[i]], 0.0)}
    out = {}
    for name, fn in stages.items():
        runs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for i in range(len(sample)):
                fn(i)
            runs.append((time.perf_counter() - t0) / len(sample) * 1e6)
        out[f"{name}_us"] = round(sorted(runs)[len(runs) // 2], 1)
    return out


def summarize(measured: list[tuple[dict[str, Any], dict[Key, float]]], baseline: bool) -> dict[str, Any]:
    """`summary` per path and cell, and with a baseline the paired `comparison` (bench/gateway_stats.py)."""
    paths = [p for p in ("gateway", "baseline", *FLOORS) if any(r["path"] == p for r, _ in measured)]
    def cell_of(r: dict[str, Any]) -> tuple[bool, float]:
        return r["stream"], r["rate"] or r["concurrency"]

    by: dict[tuple[str, bool, float, int], tuple[dict[str, Any], dict[Key, float]]] = {
        (r["path"], *cell_of(r), r["round"]): (r, lat) for r, lat in measured}
    rounds = sorted({r["round"] for r, _ in measured})
    summary, comp = [], []
    for stream, level in sorted({cell_of(r) for r, _ in measured}):
        direct = [by[("direct", stream, level, n)][1] for n in rounds]
        for path in paths:
            cells = [(*by[(path, stream, level, n)], d) for n, d in zip(rounds, direct, strict=True)]
            summary.append({"path": path, "stream": stream, "level": level, **cell_summary(cells)})
        if baseline:
            ours = [by[("gateway", stream, level, n)] for n in rounds]
            base = [by[("baseline", stream, level, n)] for n in rounds]
            comp.append({"stream": stream, "level": level, **comparison(ours, base)})
            for fl in (p for p in FLOORS if p in paths):  # the floors against the same baseline rounds
                floor = comparison([by[(fl, stream, level, n)] for n in rounds], base)
                name = FLOORS[fl][0]
                comp[-1].update({f"{name}_{k}": floor[k] for k in ("cpu_ratio", "cpu_ratio_rounds", "cpu_ratio_ci95")})
    return {"summary": summary, "comparison": comp}


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """`gateway-cpu.json`: CPU per request of this gateway and the baseline, per (stream, level)."""
    cpu = {(s["path"], s["stream"], s["level"]): s for s in report["summary"]}
    rows = []
    for c in report["comparison"]:
        ours, base = cpu[("gateway", c["stream"], c["level"])], cpu[("baseline", c["stream"], c["level"])]
        rows.append({"stream": c["stream"], "concurrency": c["level"], "gateway_cpu_us": ours["gateway_cpu_us"],
                     "baseline_cpu_us": base["gateway_cpu_us"], "cpu_ratio": c["cpu_ratio"],
                     "cpu_ratio_rounds": c["cpu_ratio_rounds"], "cpu_ratio_ci95": c["cpu_ratio_ci95"],
                     "added_p50_ms": ours["added_p50_ms"], "baseline_added_p50_ms": base["added_p50_ms"],
                     "latency_diff_p50_ms": c["latency_diff_p50_ms"],
                     "latency_diff_p50_ci95_ms": c["latency_diff_p50_ci95_ms"]})
        for fl, (name, _) in FLOORS.items():  # the least a gateway on this stack costs, against the baseline's
            floor = cpu.get((fl, c["stream"], c["level"]))
            if floor is not None:
                rows[-1].update({f"{name}_cpu_us": floor["gateway_cpu_us"],
                                 **{f"{name}_{k}": c[f"{name}_{k}"] for k in ("cpu_ratio", "cpu_ratio_rounds",
                                                                               "cpu_ratio_ci95")}})
    return {"benchmark": "gateway-cpu", "meta": report["meta"], "route_inputs": report["route_inputs"], "rows": rows}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    prompts = load_prompts(data_root(), args.seed)
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
        env = _environment(args)
        gateways = {"gateway": _start_gateway(cli, worker_addr, env, None, procs)}
        if args.baseline:
            base = str(Path(args.baseline).resolve())
            benv = {**env, "PYTHONPATH": base}
            if args.access_log:
                benv["SPECROUTE_ACCESS_LOG_FILE"] = f"{Path(args.access_log).resolve()}.baseline"
            gateways["baseline"] = _start_gateway(cli, worker_addr, benv, base, procs)
        if args.floor:
            for fl, (_, flags) in FLOORS.items():
                gateways[fl] = _start_gateway(cli, worker_addr, env, None, procs, floor=flags)
        measured = _measure(args, worker_addr, gateways, pids, prompts)
        report = {
            "benchmark": "gateway",
            "meta": {"engine": "null", "max_tokens": args.max_tokens, "duration_s": args.duration,
                     "arrival": args.arrival, "client_procs": args.client_procs, "cpu_count": os.cpu_count(),
                     "machine": platform.machine(), "python": platform.python_version(), "time": time.time(),
                     "tracing": args.tracing, "access_log": bool(args.access_log), "rounds": args.rounds,
                     "floor": args.floor,
                     "prompts": len(prompts), "baseline": args.baseline, "command": " ".join(["bench gateway", *argv]),
                     "load_1m_end": round(os.getloadavg()[0], 2)},
            "rows": [r for r, _ in measured],
            "route_inputs": route_input_costs(prompts),
            **summarize(measured, bool(args.baseline)),
        }
        (out / args.name).write_text(json.dumps(report, indent=2))
        print(json.dumps(report["summary"], indent=2))
        print(f"wrote {out / args.name}")
        if args.baseline:
            (out / args.cpu_name).write_text(json.dumps(headline(report), indent=2))
            print(json.dumps(report["comparison"], indent=2))
            print(f"wrote {out / args.cpu_name}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return 0
