"""The fleet simulator (bench/sim): tiny traffic, hand-checkable step costs, the real policy code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.sim.core import Fleet, Gateway, Replay, Request, TableProfile, Worker, simulate, step_cost
from bench.sim.gateway_policy import RequestContext, default_policy
from bench.sim.traffic import arm_fleet, read_traffic, write_traffic


@dataclass(frozen=True)
class Flat:
    """Every verify costs 10 ms + 1 ms per row, a draft call 2 ms, prefill nothing."""

    def draft_ms(self, mode: str, rows: int) -> float:
        return 2.0

    def verify_ms(self, rows: int, width: float) -> float:
        return 10.0 + rows

    def prefill_ms(self, tokens: int) -> float:
        return 0.0

    def dcut_padding(self, rows: int) -> float:
        return 1.5

    def dcut_ms(self, rows: int) -> float:
        return 0.5


def req(i: int, domain: str = "code", temperature: float = 0.0, phase: int = 0, concurrency: int = 1,
        measured: bool = True) -> Request:
    return Request(i, phase, concurrency, {domain: 1.0}, 0.0, temperature, 10,
                   {"mtp": Replay(9, 3, 9, 6, 3), "dfly": Replay(9, 2, 14, 6, 2), "ar": Replay(9, 8)},
                   RequestContext("", "latin", "0", "short"), measured)


def one_pool(mode: str) -> tuple[Fleet, Gateway]:
    ws = (Worker("w0", (mode,)),)
    return Fleet(ws, {mode: (("w0", mode),)}), Gateway(default_policy([mode]), overhead_ms=0.0)


def test_one_request_costs_its_replayed_steps() -> None:
    fleet, gw = one_pool("mtp")
    res = simulate([req(0)], fleet, Flat(), gw)
    (out,) = res.requests
    # prefill step (no decode rows yet: the row joins and decodes in the same step): 3 steps of 2 + 11 ms
    assert out.pool == "mtp" and out.tokens == 9
    assert abs(out.t_end - 3 * 0.013) < 1e-9
    assert res.steps == 3


def test_ar_pool_takes_more_cheaper_steps_and_scale_stretches_time() -> None:
    fleet, gw = one_pool("ar")
    a = simulate([req(0)], fleet, Flat(), gw)
    b = simulate([req(0)], fleet, Flat(), gw, scale=2.0)
    assert abs(a.requests[0].t_end - 8 * 0.011) < 1e-9
    assert abs(b.requests[0].t_end - 2 * a.requests[0].t_end) < 1e-9


def test_contention_is_one_when_every_worker_is_busy_and_solo_when_one_is() -> None:
    from bench.sim.core import contention

    assert contention(2, 2, 0.9) == 1.0 and contention(1, 2, 0.9) == 0.9
    assert contention(0, 2, 0.9) == 0.9 and contention(3, 2, 0.9) == 1.0      # clamped to 1..workers
    assert abs(contention(2, 3, 0.8) - 0.9) < 1e-12                            # linear in the idle others
    assert contention(1, 1, 0.5) == 1.0                                        # one worker: always all busy
    assert contention(1, 2, 1.0) == 1.0 and contention(1, 4, 1.0) == 1.0


def _two_workers_one_outlasting() -> tuple[Fleet, Gateway, list[Request]]:
    """Static arm (chat -> mtp#0, code -> D-Cut dfly#0), one of each sent at once: the chat request takes
    6 steps of 2 + 11 ms, the code one 2 steps of 0.5 + 2 + 11 ms, so dfly#0 idles after 27 ms while
    mtp#0 still has its 4th to 6th steps to take (from 39 ms on)."""
    fleet, policy = arm_fleet("static")
    ctx = RequestContext("", "latin", "0", "short")
    long_chat = {"mtp": Replay(9, 6, 18, 12, 6), "dfly": Replay(9, 6, 18, 12, 6), "ar": Replay(9, 8)}
    short_code = {"mtp": Replay(9, 2, 14, 6, 2), "dfly": Replay(9, 2, 14, 6, 2), "ar": Replay(9, 8)}
    traffic = [Request(0, 0, 2, {"chat": 1.0}, 0.0, 0.0, 10, long_chat, ctx),
               Request(1, 0, 2, {"code": 1.0}, 0.0, 0.0, 10, short_code, ctx)]
    return fleet, Gateway(policy, overhead_ms=0.0), traffic


def test_a_worker_stepping_alone_is_priced_at_solo() -> None:
    fleet, gw, traffic = _two_workers_one_outlasting()
    res = simulate(traffic, fleet, Flat(), gw, solo=0.5)
    chat, code = res.requests
    assert (chat.worker, code.worker) == ("mtp#0", "dfly#0")
    assert abs(code.t_end - 2 * 0.0135) < 1e-9                  # both busy throughout: full price
    assert abs(chat.t_end - (3 * 0.013 + 3 * 0.0065)) < 1e-9    # the last 3 steps alone, at half price


def test_solo_one_and_one_worker_fleets_keep_the_single_factor_model() -> None:
    """solo = 1 is the model with `scale` alone (every step at its profiled cost x scale), and so is any
    solo on a one-worker fleet (the Hy3 check's)."""
    fleet, gw, traffic = _two_workers_one_outlasting()
    res = simulate(traffic, fleet, Flat(), gw, scale=2.0, solo=1.0)
    assert abs(res.requests[0].t_end - 2 * 6 * 0.013) < 1e-9 and abs(res.requests[1].t_end - 2 * 2 * 0.0135) < 1e-9
    fleet, gw = one_pool("mtp")
    many = [req(i, "chat" if i % 3 else "code", concurrency=2 if i < 10 else 5, phase=int(i >= 10)) for i in range(20)]
    a, b = simulate(many, fleet, Flat(), gw, scale=1.3), simulate(many, fleet, Flat(), gw, scale=1.3, solo=0.5)
    assert [(r.t_first, r.t_end) for r in a.requests] == [(r.t_first, r.t_end) for r in b.requests]


def test_closed_loop_segments_and_warmup_is_not_measured() -> None:
    fleet, gw = one_pool("mtp")
    traffic = [req(-1, measured=False), req(0, concurrency=2), req(1, concurrency=2), req(2, phase=1)]
    res = simulate(traffic, fleet, Flat(), gw)
    assert [r.index for r in res.measured] == [0, 1, 2]
    r0, r1, r2 = res.measured
    assert r0.t_send == r1.t_send >= res.requests[0].t_end   # the phase's two clients start together
    assert r2.t_send >= max(r0.t_end, r1.t_end)               # the next phase after the last one ends
    # both arrive at once: the first's step is under way, the second joins the next one (continuous
    # batching); a step of one row costs 2 + 11 ms, of two 2 + 12 ms
    assert abs(r0.t_end - r0.t_send - (0.013 + 2 * 0.014)) < 1e-9
    assert abs(r1.t_end - r1.t_send - (0.013 + 2 * 0.014 + 0.013)) < 1e-9
    assert res.output_tokens_per_s() > 0


def test_default_policy_routes_by_domain_and_is_deterministic() -> None:
    fleet, policy = arm_fleet("static")
    gw = Gateway(policy)
    traffic = [req(i, "chat" if i % 2 else "code", concurrency=2) for i in range(12)]
    a = simulate(traffic, fleet, Flat(), gw, seed=3)
    b = simulate(traffic, fleet, Flat(), gw, seed=3)
    assert [(r.pool, r.t_end) for r in a.requests] == [(r.pool, r.t_end) for r in b.requests]
    assert {r.pool for r in a.requests if r.domain == "chat"} == {"mtp"}
    assert {r.pool for r in a.requests if r.domain == "code"} == {"dfly"}
    assert {r.reason for r in a.requests} == {"default"}


def test_learning_moves_traffic_to_the_faster_pool() -> None:
    """Code goes to DFly by default; when DFly's replay is slow (one token a step), learning's feedback
    moves it to MTP."""
    fleet, policy = arm_fleet("learned")
    gw = Gateway(policy, stats_interval_s=0.05, load_interval_s=0.05)
    slow = {"mtp": Replay(33, 8, 24, 24, 8), "dfly": Replay(33, 32, 448, 0, 32), "ar": Replay(33, 32)}
    traffic = [Request(i, 0, 2, {"code": 1.0}, 0.0, 0.0, 10, slow, RequestContext("", "latin", "0", "short"))
               for i in range(200)]
    res = simulate(traffic, fleet, Flat(), gw, seed=1)
    late = [r.pool for r in res.requests[-50:]]
    assert late.count("mtp") > 40
    assert "learned" in {r.reason for r in res.requests}


def test_mixed_step_pads_to_the_widest_row_and_calls_each_drafter() -> None:
    @dataclass(frozen=True)
    class Width(Flat):
        def verify_ms(self, rows: int, width: float) -> float:
            return rows * width

    from bench.sim.core import Outcome, _Row

    out = Outcome(0, True, "", "", "", "", 9, 0.0)
    rows = [_Row(req(0), out, "mtp", "mtp", "chat", "", Replay(9, 3, 9, 6, 3), 0.0, 0),
            _Row(req(1), out, "dfly", "dfly", "code", "", Replay(9, 2, 14, 6, 2), 0.0, 0)]
    assert step_cost(Width(), rows) == 2.0 + 2.0 + 2 * 8.0
    # D-Cut: unequal keeps, the widest `dcut_padding` (1.5) times the mean kept drafts ((3 + 7) / 2)
    assert step_cost(Width(), rows, dcut=True) == 0.5 + 2.0 + 2.0 + 2 * (1.0 + 5.0 * 1.5)


def _rows(*reps: Replay, done: tuple[int, ...] = ()) -> list:
    from bench.sim.core import Outcome, _Row

    out = Outcome(0, True, "", "", "", "", 9, 0.0)
    return [_Row(req(i), out, "dfly", "dfly", "code", "", rep, 0.0, 0, done[i] if done else 0)
            for i, rep in enumerate(reps)]


def test_dcut_step_drafts_for_every_row_or_none() -> None:
    """D-Cut decides per step for the whole batch: a drafted step drafts and verifies every row, a plain
    step none; the worker drafts in its rows' mean drafted share of steps."""
    from bench.sim.core import _WorkerState, dcut_drafts

    half = Replay(9, 4, 8, 4, 2)                        # drafted 2 of its 4 steps, 4 drafts each
    rows = _rows(half, half, done=(0, 1))               # on their own turns, one of them drafts every step
    assert [r.drafts_now() for r in rows] == [False, True]
    assert step_cost(Flat(), rows) == 2.0 + 12.0
    ws = _WorkerState(Worker("d", ("dfly",), dcut=True))
    turns = []
    for _ in range(4):
        turns.append(dcut_drafts(ws, rows))
        for r in rows:
            r.done_steps += 1
    assert turns == [False, True, False, True]
    assert step_cost(Flat(), rows, dcut=True, drafting=False) == 12.0                 # plain: one verify
    assert step_cost(Flat(), rows, dcut=True, drafting=True) == 0.5 + 2.0 + 12.0     # every row drafts
    full, none = Replay(9, 3, 9, 6, 3), Replay(9, 8)
    assert dcut_drafts(_WorkerState(Worker("d", ("dfly",), dcut=True)), _rows(full))
    assert not dcut_drafts(_WorkerState(Worker("d", ("dfly",), dcut=True)), _rows(none))


def test_dcut_worker_takes_plain_steps_where_rows_draft_part_time() -> None:
    """Two rows drafting half their steps on their own turns, offset by a step: every step drafts for
    one of them (draft + verify padded to 5 tokens); on a D-Cut worker half the steps are plain."""
    @dataclass(frozen=True)
    class Width(Flat):
        def verify_ms(self, rows: int, width: float) -> float:
            return rows * width

        def dcut_padding(self, rows: int) -> float:
            return 1.0

        def dcut_ms(self, rows: int) -> float:
            return 0.0

    half = {"dfly": Replay(9, 8, 16, 8, 4), "mtp": Replay(9, 8, 16, 8, 4), "ar": Replay(9, 8)}
    traffic = [Request(i, 0, 2, {"code": 1.0}, 0.0, 0.0, 10, half, RequestContext("", "latin", "0", "short"))
               for i in range(2)]
    times = {}
    for dcut in (False, True):
        ws = (Worker("w0", ("dfly",), dcut=dcut),)
        fleet = Fleet(ws, {"dfly": (("w0", "dfly"),)})
        res = simulate(traffic, fleet, Width(), Gateway(default_policy(["dfly"]), overhead_ms=0.0))
        assert res.steps == 9 and [r.tokens for r in res.requests] == [9, 9]
        times[dcut] = max(r.t_end for r in res.requests)
    assert times[True] < times[False]


def test_calibration_reads_measured_phases_of_an_earlier_calibration() -> None:
    from bench.sim.calibrate import measured_phases

    doc = {"cells": {"S5": {"all-ar": {"phases": {"0": {"measured_tokens_per_s": 150.0, "simulated_tokens_per_s": 1.0,
                                                          "relative_error": 0.0}}},
                            "all-mtp": {"relative_error": 0.0}}}}
    assert measured_phases(doc) == {"S5": {"all-ar": {"0": 150.0}}}


def test_table_profile_interpolates_and_extends() -> None:
    p = TableProfile({"mtp": {1: 1.0, 4: 4.0}}, {1: {1: 10.0, 4: 13.0}, 4: {1: 20.0, 4: 26.0}}, 0.5, {4: 1.3})
    assert p.draft_ms("mtp", 2) == 2.0 and p.draft_ms("mtp", 8) == 8.0 and p.draft_ms("dfly", 3) == 0.0
    assert p.verify_ms(1, 2.0) == 11.0 and p.verify_ms(4, 4.0) == 26.0
    assert abs(p.verify_ms(2, 1.0) - (10.0 + 10.0 / 3)) < 1e-9
    assert p.prefill_ms(10) == 5.0
    assert p.dcut_padding(1) == 1.0 and abs(p.dcut_padding(2) - 1.1) < 1e-9 and abs(p.dcut_padding(4) - 1.3) < 1e-9


def test_traffic_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    groups = {"S1/1": [req(0), req(1, "chat", 0.7)], "S2/1": [req(0, measured=False)]}
    write_traffic(path, groups)
    assert read_traffic(path) == groups


def test_hy3_table_and_profile_fit() -> None:
    from bench.sim.hy3 import BENCHMARKS, CONCURRENCY, Hy3Profile, cover, paper_table

    table = paper_table()
    assert sorted(table) == list(CONCURRENCY) and set(table[4]) == {"AR", "MTP-3", "DFlash-8", "DFly-8"}
    assert table[64]["MTP-3"]["MT-Bench"] == 2350.0 and list(table[8]["AR"]) == list(BENCHMARKS)
    assert cover(0) == 0.0 and 0.99 < cover(128) < 1.0
    true = Hy3Profile(10.0, 20.0, 0.3, 0.3 / 3.902)
    ar = {c: 1000.0 * c / true.verify_ms(c, 1.0) for c in CONCURRENCY}
    fit = Hy3Profile.fit(ar)
    for c in CONCURRENCY:   # the AR column is reproduced; a row costs ROW_PER_TOKEN tokens
        assert abs(fit.verify_ms(c, 1.0) - true.verify_ms(c, 1.0)) < 1e-6
    assert abs(fit.rho / fit.gamma - 0.402 / 0.103) < 1e-9


def test_hy3_cell_speedup_follows_accepted_length() -> None:
    from bench.sim.hy3 import Hy3Profile, simulate_cell

    flat = Hy3Profile(10.0, 0.0, 0.0, 0.0)   # every step 10 ms whatever it carries; drafting free
    ar = simulate_cell(flat, "ar", 1.0, 4, seed=0)
    mtp = simulate_cell(flat, "mtp", 3.0, 4, seed=0)
    assert 2.4 < mtp / ar < 3.6


def test_calibration_figures_from_a_run() -> None:
    from bench.sim.calibrate import measured_figures

    run = {"cells": [{"scenario": "S1", "arms": {"all-ar": {"summary": {"output_tokens_per_s": 100.0}}}}]}
    assert measured_figures(run) == {"S1": {"all-ar": 100.0}}


def test_what_if_command_on_a_traffic_file(tmp_path: Path) -> None:
    import json

    from bench.sim.cli import main

    traffic, profile, out = tmp_path / "t.jsonl", tmp_path / "p.json", tmp_path / "r.json"
    write_traffic(traffic, {"S1/1": [req(i, "chat" if i % 3 else "code", concurrency=2) for i in range(6)]})
    profile.write_text(json.dumps({"draft_ms": {"mtp": {"1": 2.0}, "dfly": {"1": 3.0}},
                                   "verify_ms": {"1": {"1": 10.0, "16": 20.0}, "8": {"1": 20.0, "16": 60.0}},
                                   "prefill_ms_per_token": 0.1}))
    assert main(["--traffic", str(traffic), "--profile", str(profile), "--arms", "all-mtp,static",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["simulated"] is True
    row = doc["groups"]["S1/1"]
    assert row["all-mtp"]["pool_shares"] == {"mtp": 1.0} and row["static"]["requests"] == 6
    assert row["all-mtp"]["output_tokens_per_s"] > 0
