"""`bench gateway`'s numbers (bench/gateway_stats.py): per-request added latency and paired intervals."""

from __future__ import annotations

from bench.gateway_stats import added, bootstrap, cell_summary, comparison, percentile


def test_added_latency_pairs_requests_by_key_not_percentiles() -> None:
    direct = {(0, 0, n): 0.010 + 0.001 * n for n in range(10)}
    path = {(0, 0, n): direct[(0, 0, n)] + 0.002 for n in range(0, 10, 2)}   # half of them, 2 ms more each
    assert sorted(round(x, 6) for x in added(path, direct)) == [0.002] * 5
    s = cell_summary([({"gateway_cpu_us": 500.0, "requests_per_s": 10.0}, path, direct)])
    assert s["added_p50_ms"] == 2.0 and s["added_p99_ms"] == 2.0 and s["paired_requests"] == 5
    assert percentile([], 50) != percentile([], 50)   # nan


def test_the_comparison_is_paired_by_round_with_intervals() -> None:
    lat = {(0, 0, 0): 0.01, (0, 0, 1): 0.02}
    ours = [({"gateway_cpu_us": 300.0}, lat), ({"gateway_cpu_us": 330.0}, lat)]
    base = [({"gateway_cpu_us": 600.0}, lat), ({"gateway_cpu_us": 550.0}, lat)]
    c = comparison(ours, base)
    assert c["cpu_ratio_rounds"] == [0.5, 0.6] and 0.5 <= c["cpu_ratio"] <= 0.6
    assert c["cpu_ratio_ci95"][0] >= 0.5 and c["cpu_ratio_ci95"][1] <= 0.6
    assert c["latency_diff_p50_ms"] == 0.0 and c["paired_requests"] == 4
    lo, hi = bootstrap([1.0, 2.0, 3.0], lambda v: sum(v) / len(v), n=200)
    assert 1.0 <= lo <= 2.0 <= hi <= 3.0


def test_the_floor_is_reported_against_the_same_baseline_rounds() -> None:
    from bench.gateway import headline, summarize

    lat = {(0, 0, 0): 0.01}
    cpu = {"direct": None, "gateway": 600.0, "baseline": 700.0, "floor": 280.0, "floor-classify": 420.0}
    measured = [({"path": p, "stream": False, "concurrency": 16, "rate": 0.0, "round": r, "requests_per_s": 1.0,
                  **({"gateway_cpu_us": c + 10 * r} if c else {})}, lat)
                for r in range(2) for p, c in cpu.items()]
    report = summarize(measured, baseline=True)
    assert {s["path"] for s in report["summary"]} == {"gateway", "baseline", "floor", "floor-classify"}
    row = headline({**report, "meta": {}, "route_inputs": {}})["rows"][0]
    assert row["floor_cpu_us"] == 285.0 and row["floor_cpu_ratio_rounds"] == [0.4, round(290 / 710, 3)]
    assert row["gateway_cpu_us"] == 605.0 and row["baseline_cpu_us"] == 705.0
    assert row["floor_classify_cpu_us"] == 425.0 and row["floor_classify_cpu_ratio_rounds"][0] == 0.6
