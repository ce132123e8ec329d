"""The numbers of `specroute bench gateway` (pure: measured rows in, summaries out).

- Added latency is taken per request: a request of a gateway and the direct request of the same key
  (same prompt, same slot in the same round) pair up, and the percentiles are of those per-request
  differences, not differences of each path's percentiles.
- The headline comparison (this gateway against `--baseline`) is paired by round: each round's
  ratio of CPU time per request, and each request's added latency against the baseline's for the same
  key; 95% intervals by bootstrap (resampling rounds, or paired requests), seeded.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Key = tuple[int, int, int]          # (client process, client slot, request number)
Latencies = Mapping[Key, float]     # seconds of the requests that succeeded in the measured window


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    i = min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))
    return s[i]


def added(path: Latencies, direct: Latencies) -> list[float]:
    """Per-request added latency (s): each request of `path` minus the direct request of its key."""
    return [path[k] - direct[k] for k in path.keys() & direct.keys()]


def bootstrap(xs: Sequence[float], stat: Callable[[Sequence[float]], float], n: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """95% interval of `stat` over resamples of `xs` (nan, nan without data)."""
    if not xs:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    vals = sorted(stat([xs[rng.randrange(len(xs))] for _ in xs]) for _ in range(n))
    return vals[int(0.025 * (n - 1))], vals[int(0.975 * (n - 1))]


def _ms(x: float) -> float:
    return round(x * 1000.0, 3)


def cell_summary(cells: Sequence[tuple[Mapping[str, Any], Latencies, Latencies]]) -> dict[str, Any]:
    """One (path, stream, concurrency) over its rounds: `cells` = (row, its latencies, the direct
    latencies of the same round). Per-request added latency pooled over rounds, CPU per round."""
    diffs = [d for _, lat, direct in cells for d in added(lat, direct)]
    cpu = [float(r["gateway_cpu_us"]) for r, _, _ in cells if r.get("gateway_cpu_us")]
    return {
        "added_p50_ms": _ms(percentile(diffs, 50)), "added_p90_ms": _ms(percentile(diffs, 90)),
        "added_p99_ms": _ms(percentile(diffs, 99)), "paired_requests": len(diffs),
        "added_p50_ci95_ms": [_ms(x) for x in bootstrap(diffs, lambda v: percentile(v, 50), n=400)],
        "gateway_cpu_us": round(statistics.median(cpu), 1) if cpu else None,
        "gateway_cpu_us_rounds": cpu,
        "requests_per_s": statistics.median(float(r["requests_per_s"]) for r, _, _ in cells),
    }


def comparison(ours: Sequence[tuple[Mapping[str, Any], Latencies]],
               base: Sequence[tuple[Mapping[str, Any], Latencies]]) -> dict[str, Any]:
    """This gateway against the baseline over the same rounds (`ours[i]`, `base[i]`: round i's row and
    latencies): the CPU ratio per round with its interval, and the paired latency difference."""
    ratios = [float(a["gateway_cpu_us"]) / float(b["gateway_cpu_us"])
              for (a, _), (b, _) in zip(ours, base, strict=True) if a.get("gateway_cpu_us") and b.get("gateway_cpu_us")]
    diffs = [d for (_, la), (_, lb) in zip(ours, base, strict=True) for d in added(la, lb)]
    return {
        "cpu_ratio": round(statistics.median(ratios), 3) if ratios else None,
        "cpu_ratio_rounds": [round(r, 3) for r in ratios],
        "cpu_ratio_ci95": [round(x, 3) for x in bootstrap(ratios, statistics.median)],
        "latency_diff_p50_ms": _ms(percentile(diffs, 50)),
        "latency_diff_p50_ci95_ms": [_ms(x) for x in bootstrap(diffs, lambda v: percentile(v, 50), n=400)],
        "paired_requests": len(diffs),
    }
