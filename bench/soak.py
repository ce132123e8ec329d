"""`specroute bench soak`: the whole system (`specroute serve` on a bundle) under sustained mixed traffic
while its workers are killed, and whether it loses anything or grows.

    specroute bench soak --minutes 10 [--model models/demo] [--concurrency 8] [--out bench/results/chaos.json]

`--concurrency` client threads send one request after another for `--minutes`: non-streaming and
streaming chat and code requests, streams the client abandons after their first event (a cancellation),
and bad inputs (malformed JSON, a wrong Content-Type, a missing field, out-of-range parameters, an
unknown model); a client whose request failed waits 1 s (the 503's `Retry-After`) before its next.
Every minute (from half past the first) one worker, in turn, gets `kill -9` while the gateway sees every
pool healthy (a restart that takes longer than that delays the next kill: `late_s`); the supervisor
restarts it. Each request ends as exactly one of:

- `served`: a complete answer (JSON with choices, or a stream that reached `[DONE]`);
- `cancelled`: a stream the client closed on purpose after its first event;
- `rejected`: a bad input answered with a 4xx OpenAI-shaped error (what it should get);
- `failed`: a good request answered with an OpenAI-shaped error (its `code` is the cause);
- `lost`: anything else: no answer within the deadline, a cut stream, a non-OpenAI body, a refused
  connection, a bad input accepted or answered 5xx.

The acceptance is `lost == 0` and a flat resident memory: RSS of the gateway and of the gateway plus
the workers, sampled every 5 s from /proc, at the start (after a warm-up) and at the end, within 10%.
A restarted worker starts small and grows while it loads, so the samples compared are the ones just
before each kill (`steady`): the end is the last of them.
The result is the `soak` section of `--out` (the chaos suite's file; its fault rows are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specroute.readiness import free_port, poll_until

REPO = Path(__file__).resolve().parents[1]
CHAT = "Tell me a short story about a friendly dog."
CODE = "Write a Python function `def add(a, b):` that returns a + b.\n```python\n"
# the traffic mix, one entry per request in turn (each thread starts at a different place)
MIX = ("chat", "code-stream", "chat-stream", "cancel", "code", "bad", "chat-stream", "code-stream", "cancel", "bad")
BAD = ("malformed-json", "content-type", "no-messages", "max-tokens", "temperature", "unknown-model")
RETRY_S = 1.0
SERVE_ENV = {  # the chaos suite's settings: a dead endpoint is noticed within a health interval
    "SPECROUTE_WORKER_THREADS": "1", "SPECROUTE_HEALTH_INTERVAL_S": "0.25", "SPECROUTE_BREAKER_COOLDOWN_S": "1",
    "SPECROUTE_REQUEST_TIMEOUT_S": "30", "SPECROUTE_SERVE_RESTART_BACKOFF_S": "0.2",
    "SPECROUTE_SERVE_DRAIN_TIMEOUT_S": "5", "OMP_NUM_THREADS": "1",
}


def is_openai_error(obj: Any) -> bool:
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err)


@dataclass
class Result:
    kind: str
    result: str  # served | cancelled | rejected | failed | lost
    latency_s: float
    cause: str = ""  # the error code (rejected, failed) or what went wrong (lost)


def bad_request(client: httpx.Client, which: str, deadline_s: float) -> httpx.Response:
    msgs = [{"role": "user", "content": CHAT}]
    t = httpx.Timeout(deadline_s, connect=5.0)
    if which == "malformed-json":
        return client.post("/v1/chat/completions", content=b'{"model": "specroute", "messages": [',
                           headers={"content-type": "application/json"}, timeout=t)
    if which == "content-type":
        return client.post("/v1/chat/completions", content=b"model=specroute",
                           headers={"content-type": "application/x-www-form-urlencoded"}, timeout=t)
    body: dict[str, Any] = {"model": "specroute", "messages": msgs, "max_tokens": 8}
    if which == "no-messages":
        del body["messages"]
    elif which == "max-tokens":
        body["max_tokens"] = -3
    elif which == "temperature":
        body["temperature"] = 7.5
    elif which == "unknown-model":
        body["model"] = "no-such-model"
    return client.post("/v1/chat/completions", json=body, timeout=t)


def one(client: httpx.Client, kind: str, n: int, deadline_s: float, max_tokens: int) -> Result:
    """Send one request of `kind` and classify how it ended (never raises)."""
    t0 = time.monotonic()

    def done(result: str, cause: str = "") -> Result:
        return Result(kind, result, time.monotonic() - t0, cause)

    try:
        if kind == "bad":
            which = BAD[n % len(BAD)]
            r = bad_request(client, which, deadline_s)
            obj = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
            if 400 <= r.status_code < 500 and is_openai_error(obj):
                return Result(f"bad:{which}", "rejected", time.monotonic() - t0, f"{r.status_code} {obj['error']['code']}")
            return Result(f"bad:{which}", "lost", time.monotonic() - t0, f"bad input answered {r.status_code}")
        stream = kind.endswith("-stream") or kind == "cancel"
        body = {"model": "specroute", "max_tokens": max_tokens, "stream": stream,
                "messages": [{"role": "user", "content": CODE if kind.startswith("code") else CHAT}]}
        with client.stream("POST", "/v1/chat/completions", json=body,
                           timeout=httpx.Timeout(deadline_s, connect=5.0)) as r:
            if r.status_code != 200 or not stream:
                obj = json.loads(r.read())
                if r.status_code == 200 and obj.get("choices"):
                    return done("served")
                if r.status_code != 200 and is_openai_error(obj):
                    return done("failed", f"{r.status_code} {obj['error']['code']}")
                return done("lost", f"status {r.status_code}, not an OpenAI body")
            last = None
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                last = line[6:]
                if kind == "cancel":
                    return done("cancelled")  # leaving the block closes the connection mid-stream
                if time.monotonic() - t0 > deadline_s:
                    return done("lost", "stream past its deadline")
            if last == "[DONE]":
                return done("served")
            if last is not None and is_openai_error(json.loads(last)):
                return done("failed", f"stream {json.loads(last)['error']['code']}")
            return done("lost", "stream cut without [DONE] or an error event")
    except httpx.ConnectError:
        return done("lost", "connection refused")
    except httpx.TimeoutException:
        return done("lost", "no answer within the deadline")
    except (httpx.HTTPError, ValueError) as exc:
        return done("lost", type(exc).__name__)


def rss_kb(pid: int) -> int:
    """Resident set size of `pid` in kB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class Serve:
    """`specroute serve` in its own session, with its status file for the children's pids (or, from
    `attach`, one that runs already)."""

    proc: subprocess.Popen[bytes] | None = None
    start_s = 0.0

    @classmethod
    def attach(cls, url: str, status_path: Path) -> Serve:
        """A `specroute serve` started elsewhere (the chaos suite's): its gateway URL and status file."""
        s = cls.__new__(cls)
        s.url, s.status_path = url, status_path
        return s

    def __init__(self, model: str, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.status_path = tmp / "status.json"
        self.log_path = tmp / "serve.log"
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env.update(SERVE_ENV)
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specroute.cli", "serve", "--model", model, "--port", str(self.port),
             "--status-file", str(self.status_path)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        if not poll_until(self._ready, 600, 0.5, alive=self._alive):
            raise RuntimeError(f"specroute serve not ready:\n{self.log_path.read_text(errors='replace')[-3000:]}")
        self.start_s = time.monotonic() - t0

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200 and self.status_path.is_file()
        except httpx.HTTPError:
            return False

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"specroute serve exited {self.proc.returncode}")

    def children(self) -> dict[str, dict[str, Any]]:
        for _ in range(20):
            try:
                return json.loads(self.status_path.read_text())["children"]  # type: ignore[no-any-return]
            except (OSError, ValueError):
                time.sleep(0.05)  # caught mid-write
        return {}

    def workers(self) -> list[str]:
        return sorted(n for n in self.children() if n.endswith("worker"))

    def rss(self) -> dict[str, int]:
        kids = self.children()
        gw = rss_kb(int(kids["gateway"]["pid"])) if kids.get("gateway", {}).get("pid") else 0
        workers = sum(rss_kb(int(c["pid"])) for n, c in kids.items() if n.endswith("worker") and c.get("pid"))
        return {"gateway_kb": gw, "workers_kb": workers, "total_kb": gw + workers}

    def kill(self, name: str) -> tuple[int, float]:
        pid = int(self.children()[name]["pid"])
        os.kill(pid, signal.SIGKILL)
        return pid, time.monotonic()

    def is_back(self, name: str, old_pid: int) -> bool:
        c = self.children().get(name, {})
        return c.get("state") == "up" and c.get("pid") != old_pid

    def all_healthy(self) -> bool:
        """The gateway sees every pool healthy (`/readyz` says `ready`, not `degraded`)."""
        try:
            return httpx.get(self.url + "/readyz", timeout=5).json().get("status") == "ready"
        except (httpx.HTTPError, ValueError):
            return False

    def metric(self, name: str) -> float:
        """The sum of a counter's series on the gateway's /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def pctl(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s))) - 1))]


def steady(rss: list[dict[str, Any]], kills: list[dict[str, Any]], before_s: float = 0.0) -> list[dict[str, Any]]:
    """The samples of the system at its fullest between kills: the first one (after the warm-up) and, for
    each kill, the last one taken before it (a killed worker restarts small and grows back while it loads
    and serves; by the next kill it is whole). `before_s`: samples stamped up to that much before they
    were taken."""
    out = rss[:1]
    for k in kills:
        prev = [s for s in rss if s["t_s"] < k["t_s"] - before_s]
        if prev and prev[-1] is not out[-1]:
            out.append(prev[-1])
    return out


def rss_figures(rss: list[dict[str, Any]], kills: list[dict[str, Any]], before_s: float = 0.0) -> dict[str, Any]:
    """RSS at the start (after the warm-up) and at the end (the last `steady` sample: just before the last
    kill), the drift between them, and the range of the steady samples."""
    kept = steady(rss, kills, before_s=before_s) or rss[:1]
    first, last = kept[0], kept[-1]

    def drift(key: str) -> float:
        return round(last[key] / first[key] - 1, 4) if first[key] else 0.0

    return {"rss_start_kb": first, "rss_end_kb": last, "rss_drift_gateway": drift("gateway_kb"),
            "rss_drift_total": drift("total_kb"), "rss_steady_samples": len(kept),
            "rss_steady_total_kb_range": [min(s["total_kb"] for s in kept), max(s["total_kb"] for s in kept)],
            "rss_max_total_kb": max(s["total_kb"] for s in rss)}


def summarize(results: list[Result], rss: list[dict[str, Any]], kills: list[dict[str, Any]]) -> dict[str, Any]:
    """The soak's figures: counts by outcome and cause, latency of the served requests, RSS drift."""
    by = Counter(r.result for r in results)
    served = [r.latency_s for r in results if r.result == "served"]
    return {
        "requests": len(results), "served": by["served"], "cancelled": by["cancelled"], "rejected": by["rejected"],
        "failed": by["failed"], "lost": by["lost"],
        "failed_by_cause": dict(Counter(r.cause for r in results if r.result == "failed").most_common()),
        "lost_by_cause": dict(Counter(r.cause for r in results if r.result == "lost").most_common()),
        "rejected_by_cause": dict(Counter(r.cause for r in results if r.result == "rejected").most_common()),
        "by_kind": {k: dict(Counter(r.result for r in results if r.kind.split(":")[0] == k))
                    for k in sorted({r.kind.split(":")[0] for r in results})},
        "latency_served_s": {"p50": round(pctl(served, 0.5) or 0, 3), "p99": round(pctl(served, 0.99) or 0, 3),
                             "max": round(max(served, default=0), 3)},
        "worker_kills": len(kills), "kills": kills,
        **rss_figures(rss, kills),
    }


def soak(model: str, minutes: float, concurrency: int, warmup_s: float, max_tokens: int, deadline_s: float,
         kill_every_s: float) -> dict[str, Any]:
    serve = Serve(model, Path(tempfile.mkdtemp(prefix="specroute-soak-")))
    try:
        doc = run(serve, minutes, concurrency, warmup_s, max_tokens, deadline_s, kill_every_s)
    finally:
        serve.stop()
    doc.update(model=model, system_start_s=round(serve.start_s, 1), settings=SERVE_ENV)
    return doc


def run(serve: Serve, minutes: float, concurrency: int, warmup_s: float, max_tokens: int, deadline_s: float,
        kill_every_s: float) -> dict[str, Any]:
    """The soak's traffic and kills against `serve` for `minutes` (after `warmup_s`); its figures."""
    results: list[Result] = []
    lock = threading.Lock()
    stop = threading.Event()
    counting = threading.Event()

    def client_loop(i: int) -> None:
        n = i * 3
        with httpx.Client(base_url=serve.url) as client:
            while not stop.is_set():
                kind = MIX[n % len(MIX)]
                counted = counting.is_set()   # a request counts when it started on the clock
                res = one(client, kind, n // len(MIX) + i, deadline_s, max_tokens)
                n += 1
                if counted:
                    with lock:
                        results.append(res)
                if res.result in ("failed", "lost"):
                    stop.wait(RETRY_S)   # as a client honouring the 503's `Retry-After` (1 s) would

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    try:
        time.sleep(warmup_s)  # the memory every part takes once it has served each kind of request
        counting.set()
        t0 = time.monotonic()
        end = t0 + minutes * 60
        workers = serve.workers()
        rss = [{"t_s": 0.0, **serve.rss()}]
        kills: list[dict[str, Any]] = []
        pending: tuple[str, int, float] | None = None   # the last kill until its worker is up again
        next_kill, next_rss = t0 + kill_every_s / 2, t0 + 5
        while time.monotonic() < end:
            now = time.monotonic()
            if pending is not None and serve.is_back(pending[0], pending[1]):
                kills[-1]["back_s"] = round(now - pending[2], 1)
                pending = None
            # one kill a minute, each while the other workers serve (the gateway sees every pool healthy:
            # a restart slower than a minute delays the next kill, and the delay is recorded)
            if now >= next_kill and pending is None and serve.all_healthy():
                name = workers[len(kills) % len(workers)]
                pid, since = serve.kill(name)
                kills.append({"t_s": round(since - t0, 1), "worker": name, "late_s": round(since - next_kill, 1),
                              "back_s": None})
                pending = (name, pid, since)
                next_kill = max(next_kill + kill_every_s, since + kill_every_s / 2)
            if now >= next_rss:
                rss.append({"t_s": round(time.monotonic() - t0, 1), **serve.rss()})   # stamped when taken
                next_rss += 5
            time.sleep(0.1)
        rss.append({"t_s": round(time.monotonic() - t0, 1), **serve.rss()})
        counting.clear()  # requests that started on the clock and end after it still count
    finally:
        stop.set()
        for t in threads:
            t.join(deadline_s + 10)
    doc = summarize(results, rss, kills)
    doc.update(minutes=minutes, concurrency=concurrency, warmup_s=warmup_s, max_tokens=max_tokens,
               deadline_s=deadline_s, rss_samples=rss, migrated_requests=serve.metric("specroute_migrations_total"))
    return doc


def cpu_model() -> str:
    """This machine's CPU model (/proc/cpuinfo), or "" where there is none."""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name"))
    except (OSError, StopIteration):
        return ""
    return line.split(":", 1)[1].strip()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specroute bench soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--model", default="models/demo")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--warmup", type=float, default=20.0, help="seconds of traffic before the clock starts")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--deadline", type=float, default=60.0, help="a request without an answer by then is lost")
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between worker kills")
    p.add_argument("--out", default="bench/results/chaos.json",
                   help="write the `soak` section of this file (kept: its other sections)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    doc = soak(a.model, a.minutes, a.concurrency, a.warmup, a.max_tokens, a.deadline, a.kill_every)
    doc = {"command": "specroute bench soak " + " ".join(argv or []), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "load_avg_1m_at_end": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "cpu": cpu_model(), **doc}
    out = Path(a.out)
    full = json.loads(out.read_text()) if out.is_file() else {}
    full["soak"] = doc
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(full, indent=1) + "\n")
    keys = ("requests", "served", "cancelled", "rejected", "failed", "lost", "failed_by_cause", "lost_by_cause",
            "latency_served_s", "worker_kills", "migrated_requests", "rss_start_kb", "rss_end_kb", "rss_drift_gateway", "rss_drift_total",
            "rss_steady_total_kb_range")
    print(json.dumps({k: doc[k] for k in keys}, indent=1))
    ok = doc["lost"] == 0 and abs(doc["rss_drift_total"]) <= 0.10
    print(f"soak: {'PASS' if ok else 'FAIL'} (lost {doc['lost']}, RSS drift {doc['rss_drift_total']:+.1%}) -> {out}")
    return 0 if ok else 1
