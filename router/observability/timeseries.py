"""The dashboard's time series, kept in Redis so that every gateway replica draws the same picture.

Each gateway counts its finished completion requests in memory (`SeriesSampler.observe`, called
where the completion handler finishes: a few additions, no I/O) and every `interval_s` writes one
sample of what happened since the last one to the sorted set `{specroute}:ts` (score: time; member:
JSON), trimmed to `retention_s` and at most `MAX_SAMPLES` members. A sample holds requests per
domain x pool, errors, completion tokens, a latency histogram (`BUCKETS_MS`) and the decayed mean
accepted length per domain x pool from the statistics snapshot.

`aggregate` (pure) merges the samples of all gateways into time buckets: goodput (completion
tokens/s), requests/s, errors/s, p50/p99 latency (from the merged histograms), routing shares per
domain and mean accepted length per domain x pool.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from router.state.snapshot import REDIS_FAILURES
from router.state.store import PolicyStore
from router.tasks import run_every
from specroute.contracts.feedback import PREFIX

log = logging.getLogger("specroute.gateway.timeseries")

SERIES_KEY = PREFIX + "ts"
MAX_SAMPLES = 20_000
BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)


class SeriesSampler:
    def __init__(self, store: PolicyStore | None, interval_s: float, retention_s: float,
                 mal: Callable[[], Mapping[tuple[str, str], float]], on_error: Callable[[BaseException], None],
                 gateway_id: str | None = None) -> None:
        self.store = store
        self.interval_s = interval_s
        self.retention_s = retention_s
        self.mal = mal
        self.on_error = on_error
        self.gateway_id = gateway_id or os.urandom(4).hex()
        self.closing = False
        self._reset()

    def _reset(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.errors = 0
        self.tokens = 0
        self.hist = [0] * (len(BUCKETS_MS) + 1)

    def observe(self, domain: str | None, pool: str | None, status: int, tokens: int, latency_s: float) -> None:
        """One finished completion request (called on the request path: in-memory counts only)."""
        self.requests[(domain or "unknown", pool or "none")] += 1
        if status >= 500:
            self.errors += 1
        self.tokens += tokens
        self.hist[bisect.bisect_left(BUCKETS_MS, latency_s * 1000.0)] += 1

    def take(self, now: float) -> dict[str, Any]:
        """The sample since the last one (and start a new interval)."""
        sample = {
            "t": round(now, 3), "gw": self.gateway_id, "dt": self.interval_s,
            "req": [[d, p, n] for (d, p), n in sorted(self.requests.items())],
            "err": self.errors, "tok": self.tokens, "hist": self.hist,
            "mal": [[d, p, round(v, 4)] for (d, p), v in sorted(self.mal().items())],
        }
        self._reset()
        return sample

    async def write(self, now: float | None = None) -> None:
        assert self.store is not None
        now = time.time() if now is None else now
        sample = self.take(now)
        pipe = self.store.client.pipeline(transaction=False)
        pipe.zadd(SERIES_KEY, {orjson.dumps(sample): now})
        pipe.zremrangebyscore(SERIES_KEY, "-inf", now - self.retention_s)
        pipe.zremrangebyrank(SERIES_KEY, 0, -MAX_SAMPLES - 1)
        await pipe.execute()

    async def _step(self) -> None:
        try:
            await self.write()
        except REDIS_FAILURES as exc:  # Redis down: this interval is lost, not the loop
            self.on_error(exc)

    def start(self) -> list[asyncio.Task[None]]:
        if self.store is None:
            return []
        loop = run_every(self.interval_s, self._step, lambda: self.closing, "time-series sampler")
        return [asyncio.create_task(loop, name="specroute-timeseries")]

    async def read(self, window_s: float, now: float | None = None) -> list[dict[str, Any]]:
        assert self.store is not None
        now = time.time() if now is None else now
        raw = await self.store.client.zrangebyscore(SERIES_KEY, now - window_s, "+inf")
        return [orjson.loads(r) for r in raw]


def percentile(hist: list[int], q: float) -> float | None:
    """The `q` quantile (0..1) of a `BUCKETS_MS` histogram, as its bucket's upper bound in ms."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    acc = 0
    for i, n in enumerate(hist):
        acc += n
        if acc >= rank:
            return float(BUCKETS_MS[i]) if i < len(BUCKETS_MS) else float(BUCKETS_MS[-1]) * 2
    return float(BUCKETS_MS[-1]) * 2


def aggregate(samples: Iterable[Mapping[str, Any]], step_s: float) -> dict[str, Any]:
    """Samples of every gateway merged into `step_s` buckets (pure)."""
    buckets: dict[int, list[Mapping[str, Any]]] = {}
    for s in samples:
        buckets.setdefault(int(float(s["t"]) // step_s), []).append(s)
    out: dict[str, Any] = {"step_s": step_s, "t": [], "goodput_tps": [], "requests_per_s": [], "errors_per_s": [],
                           "p50_ms": [], "p99_ms": [], "shares": {}, "mal": {}}
    keys = sorted(buckets)
    share_rows: list[dict[tuple[str, str], float]] = []
    mal_rows: list[dict[str, float]] = []
    for k in keys:
        group = buckets[k]
        hist = [0] * (len(BUCKETS_MS) + 1)
        req: Counter[tuple[str, str]] = Counter()
        tok = err = 0
        mal: dict[str, list[float]] = {}
        for s in group:
            for i, n in enumerate(s["hist"]):
                hist[i] += int(n)
            for d, p, n in s["req"]:
                req[(d, p)] += int(n)
            tok += int(s["tok"])
            err += int(s["err"])
            for d, p, v in s["mal"]:
                mal.setdefault(f"{d}/{p}", []).append(float(v))
        out["t"].append(k * step_s)
        out["goodput_tps"].append(tok / step_s)
        out["requests_per_s"].append(sum(req.values()) / step_s)
        out["errors_per_s"].append(err / step_s)
        out["p50_ms"].append(percentile(hist, 0.5))
        out["p99_ms"].append(percentile(hist, 0.99))
        per_domain: Counter[str] = Counter()
        for (d, _p), n in req.items():
            per_domain[d] += n
        share_rows.append({(d, p): n / per_domain[d] for (d, p), n in req.items()})
        mal_rows.append({cell: sum(v) / len(v) for cell, v in mal.items()})
    for (d, p) in sorted({c for row in share_rows for c in row}):
        out["shares"].setdefault(d, {})[p] = [row.get((d, p), 0.0) for row in share_rows]
    for cell in sorted({c for row in mal_rows for c in row}):
        out["mal"][cell] = [row.get(cell) for row in mal_rows]
    return out
