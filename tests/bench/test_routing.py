"""`specroute bench routing`: its pure parts (traces, metrics, the 90% switch, regret, identity) on
synthetic rows, and one tiny end-to-end run (real workers, gateways, Redis) marked e2e."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from bench.routing import cells_of, main, parse_levels, parse_names
from bench.routing_metrics import (
    better_pools,
    better_servers,
    default_pools,
    identity,
    median_round,
    paired_interval,
    paired_regret,
    regret,
    served_by,
    suite_totals,
    summarize,
    switch_baseline,
    switch_point,
    time_series,
)
from bench.routing_trace import SCENARIOS, PromptPool, build_trace, phase_sizes, read_prompts, segments
from specroute.contracts.split import is_heldout
from specroute.errors import UserError


@pytest.fixture(scope="module")
def prompts(data_dir: Path):
    return read_prompts(data_dir)


def test_prompts_are_held_out_and_multilingual(prompts):
    assert prompts and all(is_heldout(p.id) for p in prompts)
    assert {p.domain for p in prompts} == {"chat", "code", "math"}
    assert any(p.lang != "en" for p in prompts) and any(p.lang == "en" for p in prompts)


def test_traces_follow_their_scenario(prompts):
    n = 200
    s1 = build_trace(SCENARIOS["S1"], n, 4, PromptPool(prompts, 0), 0)
    assert len(s1) == n and [it.index for it in s1] == list(range(n))
    dom = Counter(it.domain for it in s1)
    assert 0.7 < (dom["code"] + dom["math"]) / n < 0.9
    assert {it.temperature for it in s1} == {0.0} and {it.concurrency for it in s1} == {4}
    s2 = build_trace(SCENARIOS["S2"], n, 4, PromptPool(prompts, 0), 0)
    assert Counter(it.domain for it in s2)["chat"] / n > 0.7 and {it.temperature for it in s2} == {0.0, 0.7, 1.0}
    assert SCENARIOS["S3"].requests_factor == SCENARIOS["S4"].requests_factor == 2.0
    s3 = build_trace(SCENARIOS["S3"], n, 4, PromptPool(prompts, 0), 0)
    assert [len(seg) for seg in segments(s3)] == [100, 100]
    assert {it.temperature for it in s3[:100]} == {0.0} and len({it.temperature for it in s3[100:]}) == 3
    s5 = build_trace(SCENARIOS["S5"], n, 4, PromptPool(prompts, 0), 0)
    assert [(seg[0].concurrency, len(seg)) for seg in segments(s5)] == [(2, 40), (16, 120), (2, 40)]
    s6 = build_trace(SCENARIOS["S6"], n, 4, PromptPool(prompts, 0), 0)
    assert 0.35 < sum(it.lang != "en" for it in s6) / n < 0.65
    assert len({it.domain for it in s6 if it.lang != "en"}) == 3
    # deterministic, and warm-up prompts (drawn first from the same pool) are not measured again
    assert build_trace(SCENARIOS["S6"], n, 4, PromptPool(prompts, 0), 0) == s6
    pool = PromptPool(prompts, 0)
    warm = build_trace(SCENARIOS["S1"], 10, 4, pool, 0, phase=0)
    measured = build_trace(SCENARIOS["S1"], 30, 4, pool, 0)
    assert not {it.prompt_id for it in warm} & {it.prompt_id for it in measured}


def test_phase_sizes_and_cli_parsing():
    assert phase_sizes(SCENARIOS["S5"], 20) == [4, 12, 4]
    assert sum(phase_sizes(SCENARIOS["S3"], 7)) == 7
    assert parse_names("S1, S3", list(SCENARIOS), "scenarios") == ["S1", "S3"]
    assert parse_levels("4,16") == [4, 16]
    with pytest.raises(UserError):
        parse_names("S9", list(SCENARIOS), "scenarios")
    with pytest.raises(UserError):
        parse_levels("0")
    names = [c[0] for c in cells_of(["S1", "S5"], [4, 16])]
    assert names == ["S1@c4", "S1@c16", "S5"]
    from bench.routing import build_parser
    from bench.routing_system import ARMS, CONTROL_ARMS

    default = build_parser().parse_args([]).arms.split(",")   # the noise control runs only when named
    assert set(CONTROL_ARMS) == {"all-mtp-twin", "learned-shared-least"} and not set(CONTROL_ARMS) & set(default)
    assert len(default) == len(ARMS) - len(CONTROL_ARMS)
    assert ARMS["learned-shared-least"].gateway_env == {"SPECROUTE_AFFINITY_SLACK": "0"}   # the affinity control
    assert ARMS["all-mtp-twin"].pools["mtp"] == (("mtp", 2), ("mtp", 3))   # its own two MTP processes


def row(i: int, pool: str, *, phase: int = 0, domain: str = "code", t: float = 0.0, send: float = 0.0,
        dur: float = 1.0, tokens: int = 10, accepted: int = 0, steps: int = 10, ok: bool = True, text: str = "x"):
    return {"index": i, "phase": phase, "domain": domain, "lang": "en", "temperature": t, "concurrency": 1,
            "t_send": send, "t_first": send + 0.1, "t_end": send + dur, "ok": ok, "completion_tokens": tokens,
            "pool": pool, "reason": "default", "classified": domain, "drafted": 0, "accepted": accepted,
            "steps": steps, "text": text}


def test_summary_series_and_regret():
    rows = [row(0, "dfly", send=0.0, dur=1.0, accepted=10, steps=5), row(1, "mtp", send=1.0, dur=1.0, steps=10),
            row(2, "mtp", send=1.5, ok=False, tokens=0)]
    s = summarize(rows)
    assert s["requests"] == 3 and s["errors"] == 1 and s["output_tokens"] == 20
    assert s["wall_s"] == 2.5 and s["output_tokens_per_s"] == 8.0
    assert s["mean_accepted_length"] == 1.667   # (10 accepted + 15 steps) / 15 steps
    assert s["pool_shares"] == {"dfly": 0.5, "mtp": 0.5} and s["ttft_p50_ms"] == 100.0
    ts = time_series(rows, 5)
    width = 2.5 / 5
    assert abs(sum(ts["goodput"]) * width - 20) < 0.1
    assert ts["shares"]["dfly"][0] == 1.0 and ts["shares"]["mtp"][2] == 1.0 and ts["shares"]["mtp"][1] is None
    r = regret({"a": 100.0, "b": 90.0})
    assert r["best_arm"] == "a" and r["regret"]["b"] == {"tokens_per_s": 10.0, "relative": 0.1}
    p = paired_regret({"a": [100.0, 80.0, 120.0], "b": [95.0, 84.0, 102.0]}, "a")   # round by round
    assert p["relative_by_round"]["b"] == [0.05, -0.05, 0.15] and p["median_relative"] == {"a": 0.0, "b": 0.05}
    iv = p["interval95"]["b"]   # b's gain against a, per round: -0.05, +0.05, -0.15
    assert iv["rounds"] == 3 and iv["median"] == -0.05 and iv["mean"] == -0.05
    lo, hi = iv["ci95"]
    assert -0.15 <= lo < iv["mean"] < hi <= 0.05   # a bootstrap of the mean stays within the rounds' range
    assert p["interval95"]["a"]["ci95"] == [0.0, 0.0]
    suite = suite_totals([{"all-mtp": {"output_tokens": 100, "wall_s": 10}, "learned": {"output_tokens": 120, "wall_s": 10}},
                          {"all-mtp": {"output_tokens": 100, "wall_s": 10}, "learned": {"output_tokens": 120, "wall_s": 10},
                           "static": {"output_tokens": 100, "wall_s": 20}}])
    assert suite["output_tokens_per_s"] == {"all-mtp": 10.0, "learned": 12.0, "static": 5.0}
    assert suite["best_static_arm"] == "all-mtp" and suite["learned_vs_best_static"] == 0.2
    assert suite["routed_vs_best_static"] == {"learned": 0.2} and suite["learned_vs_classifier_static"] == 1.4
    both = suite_totals([{"all-mtp": {"output_tokens": 100, "wall_s": 10},
                          "learned-shared": {"output_tokens": 90, "wall_s": 10}}])
    assert both["routed_vs_best_static"] == {"learned-shared": -0.1} and "learned_vs_best_static" not in both


def test_better_pools_and_switch_point():
    # phase 0: dfly decodes code faster; phase 1 (fault): mtp does; chat is mtp's in both phases
    fleets = {
        "all-dfly": [row(0, "dfly", dur=0.5), row(1, "dfly", phase=1, dur=2.0),
                     row(2, "dfly", phase=1, domain="chat", dur=2.0), row(3, "dfly", domain="chat", dur=2.0)],
        "all-mtp": [row(0, "mtp", dur=1.0), row(1, "mtp", phase=1, dur=1.0),
                    row(2, "mtp", phase=1, domain="chat", dur=1.0), row(3, "mtp", domain="chat", dur=1.0)],
        "all-ar": [row(0, "ar", dur=0.1)],   # not a pool the routed arms can choose
    }
    before, after = better_pools(fleets, 0), better_pools(fleets, 1)
    assert before == {"code|t=0": "dfly", "chat|t=0": "mtp"}
    assert after == {"code|t=0": "mtp", "chat|t=0": "mtp"}
    # 100 requests before the change; after it, chat (unaffected) alternates with code, whose first
    # 30 requests still go to dfly, then all go to mtp
    rows = [row(i, "dfly") for i in range(100)]
    code_seen = 0
    for i in range(100, 300):
        if i % 2:
            rows.append(row(i, "mtp", phase=1, domain="chat"))
        else:
            rows.append(row(i, "dfly" if code_seen < 30 else "mtp", phase=1))
            code_seen += 1
    assert default_pools(after) == {"code|t=0": "dfly", "chat|t=0": "mtp"} == before
    sw = switch_point(rows, 1, default_pools(after), after, window=50)
    assert sw["affected_classes"] == {"code|t=0": "mtp"} and sw["affected_requests"] == 100
    # the first window of 50 code requests with >= 45 on mtp starts at the 25th code request
    assert sw["affected_requests_until_90pct"] == 25 and sw["requests_until_90pct"] == 50
    assert sw["final_quarter_on_better_pool"] == 1.0
    never = switch_point([row(i, "dfly", phase=1) for i in range(60)], 1, before, after)
    assert never["requests_until_90pct"] is None
    none = switch_point(rows, 1, before, before)
    assert none["affected_requests"] == 0 and none["requests_until_90pct"] is None
    # the switch is measured against the best pool before the change: code moved (dfly -> mtp), chat did not
    assert switch_baseline({0: before, 1: after}, 1) == before
    # a fault that leaves the better pool where it was asks for no switch, whatever the default policy says
    same = {"code|t=0": "mtp"}
    assert switch_baseline({0: same, 1: same}, 1) == same
    assert switch_point(rows, 1, switch_baseline({0: same, 1: same}, 1), same)["affected_requests"] == 0
    assert switch_point(rows, 1, default_pools(same), same)["affected_requests"] == 100   # the old figure
    # a class first seen after the change falls back to the default policy's pool
    assert switch_baseline({0: {}, 1: {"math|t=0": "mtp"}}, 1) == {"math|t=0": "dfly"}


def test_paired_interval_is_deterministic_and_covers_a_steady_difference():
    a = paired_interval([0.03, 0.05, 0.04, 0.06, 0.02])
    assert a == paired_interval([0.03, 0.05, 0.04, 0.06, 0.02])
    assert 0.02 <= a["ci95"][0] < 0.04 < a["ci95"][1] <= 0.06
    assert paired_interval([]) == {"rounds": 0, "median": None, "mean": None, "ci95": None}


def test_switch_by_the_drafter_that_served():
    """A shared worker's row labelled dfly that drafted with MTP's drafter is on mtp by drafter."""
    after = {"code|t=0": "mtp"}
    narrowed = [{**row(i, "dfly", phase=1), "drafter_steps": {"mtp": 8, "dfly": 1, "plain": 1}} for i in range(60)]
    assert {served_by(r) for r in narrowed} == {"mtp"}
    assert switch_point(narrowed, 1, {"code|t=0": "dfly"}, after)["requests_until_90pct"] is None
    assert switch_point(narrowed, 1, {"code|t=0": "dfly"}, after, on=served_by)["requests_until_90pct"] == 0
    # the better fleet's D-Cut ran chat at T=1 plain: a request served plain is on it, one drafted by MTP is not
    fleets = {"all-dfly": [{**row(0, "dfly", domain="chat", t=1.0, phase=1), "drafter_steps": {"dfly": 1, "plain": 9}}],
              "all-mtp": [{**row(0, "mtp", domain="chat", t=1.0, phase=1), "drafter_steps": {"mtp": 10}},
                          {**row(1, "mtp", phase=1), "drafter_steps": {"mtp": 10}}]}
    servers = better_servers(fleets, 1, {"chat|t=high": "dfly", "code|t=0": "mtp", "math|t=0": "dfly"})
    assert servers == {"chat|t=high": "plain", "code|t=0": "mtp", "math|t=0": "dfly"}   # no rows: the pool
    went_plain = [{**row(i, "dfly", domain="chat", t=1.0, phase=1), "drafter_steps": {"plain": 10}} for i in range(60)]
    base = {"chat|t=high": "mtp"}
    assert switch_point(went_plain, 1, base, {"chat|t=high": "dfly"}, on=served_by)["requests_until_90pct"] is None
    sw = switch_point(went_plain, 1, base, {"chat|t=high": "dfly"}, on=served_by, targets=servers)
    assert sw["requests_until_90pct"] == 0 and sw["affected_classes"] == {"chat|t=high": "plain"}
    plain = {**row(0, "dfly"), "drafter_steps": {"dfly": 2, "plain": 8}}
    assert served_by(plain) == "plain" and served_by(row(0, "mtp")) == "mtp"   # no breakdown: its label
    assert served_by({**row(0, "dfly"), "drafter_steps": {"plain": 3, "mtp": 3}}) == "mtp"   # tie: sorted first
    s = summarize([{**row(0, "dfly", steps=10), "drafter_steps": {"mtp": 6, "plain": 4}},
                   {**row(1, "mtp", steps=10), "drafter_steps": {"mtp": 10}}])
    assert s["step_shares_by_drafter"] == {"mtp": 0.8, "plain": 0.2}


def test_every_arm_is_two_worker_processes_and_names_a_mode_per_pool_on_shared_workers():
    from bench.routing_metrics import ROUTED_ARMS
    from bench.routing_system import ARMS, MULTI_MODES

    for arm in ARMS.values():
        assert len({k for ks in arm.pools.values() for k in ks}) == 2, arm.name
        if arm.modes is not None:   # multi-mode workers: one pool per mode they serve
            assert set(arm.modes) == set(arm.pools) and set(arm.modes.values()) <= set(MULTI_MODES.split(","))
    assert set(ROUTED_ARMS) == {a.name for a in ARMS.values() if len(a.pools) > 1}


def test_median_round_is_the_middle_round_or_the_lower_of_the_middle_two():
    assert median_round([300.0]) == 0
    assert median_round([310.0, 290.0, 400.0]) == 0
    assert median_round([310.0, 290.0]) == 1
    assert median_round([5.0, 5.0, 1.0, 9.0]) == 0   # ties: the earlier round


def test_identity_counts_mismatches():
    texts = {"all-ar": {0: "a", 1: "b"}, "learned": {0: "a", 1: "c"}, "all-mtp": {0: "a"}}
    res = identity(texts, reference="all-ar")
    assert res["compared"] == 3 and res["mismatches"] == 1 and res["examples"][0]["index"] == 1
    assert identity({"learned": {0: "a"}})["compared"] == 0


@pytest.mark.e2e
def test_bench_routing_smoke(tmp_path):
    """Three workers (2 DFly + D-Cut, 1 MTP) on a tiny random bundle, two arms, S4 (the drafter fault
    through SIGUSR1 / SIGUSR2) with a handful of requests: every file written, no request failed."""
    from tests.engines.worker.bundle import tiny_bundle

    model = tiny_bundle(tmp_path / "m", drafters=("mtp", "dfly"))
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--scenarios", "S4", "--arms", "all-dfly,learned", "--concurrency", "2",
               "--requests-per-scenario", "3", "--warmup-requests", "2", "--max-tokens", "8", "--out", str(out),
               "--name", "r", "--repeats", "2"])
    assert rc == 0
    doc = json.loads((out / "r.json").read_text())
    (cell,) = doc["cells"]
    assert cell["cell"] == "S4@c2" and set(cell["arms"]) == {"all-dfly", "learned"} and doc["meta"]["repeats"] == 2
    for res in cell["arms"].values():
        assert res["summary"]["errors"] == 0 and res["summary"]["output_tokens_per_s"] > 0
        assert len(res["phase_starts_s"]) == 2
        tps = res["rounds_output_tokens_per_s"]   # the summary is the lower of the two rounds
        assert len(tps) == 2 and res["summary"]["output_tokens_per_s"] == min(tps) == tps[res["median_round"] - 1]
    # every round of every arm against the first: 3 x 6 T=0 requests
    assert cell["t0_identity"]["compared"] == 18 and cell["t0_identity"]["mismatches"] == 0
    assert (out / "r.png").stat().st_size > 1000
    with gzip.open(out / "r-requests.jsonl.gz", "rt") as f:
        got = [json.loads(line) for line in f]
    assert len(got) == 24 and {(r["arm"], r["round"]) for r in got} == {(a, k) for a in ("all-dfly", "learned")
                                                                          for k in (1, 2)}
    logs = (out / "tmp" / "routing-logs" / "worker-dfly-0.log").read_text()
    assert "drafter degraded" in logs and "drafter restored" in logs


def test_restart_workers_gives_each_arm_processes_of_its_own(tmp_path, monkeypatch):
    """`System.restart_workers`: the arm's old worker processes are stopped and new ones started (new
    pids), so no D-Cut or step-cost state carries over from the arm before. Worker processes here are
    stand-ins (a sleeping Python), their readiness check a stub: what is tested is the bookkeeping."""
    import subprocess
    import sys

    from bench import routing_system

    monkeypatch.setattr(routing_system, "grpc_serving", lambda addr: True)

    def start(self, key):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return key, proc, f"127.0.0.1:{1000 + len(self.workers)}", tmp_path / "w.log"

    monkeypatch.setattr(routing_system.System, "_start_worker", start)
    system = routing_system.System(tmp_path, tmp_path / "logs", 0.0, 0)
    try:
        keys = [("mtp", 0), ("mtp", 1)]
        first = system.restart_workers(keys)
        old = [system.workers[k][0] for k in keys]
        second = system.restart_workers(keys)
        assert set(first) == set(second) == {"mtp#0", "mtp#1"}
        assert not set(first.values()) & set(second.values())
        assert all(p.poll() is not None for p in old)   # the previous arm's processes are gone
        assert all(system.workers[k][0].poll() is None for k in keys)
    finally:
        system.close()
