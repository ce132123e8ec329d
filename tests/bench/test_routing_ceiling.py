"""bench/routing_ceiling.py: how much routing could gain over the best fleet, on synthetic rows."""

from __future__ import annotations

import pytest

from bench.routing_ceiling import cell_ceiling, oracle, request_unit, suite_ceiling


def req(i: int, *, domain: str = "code", dur: float = 1.0, tokens: int = 10, phase: int = 0, t: float = 0.0,
        ok: bool = True) -> dict:
    return {"index": i, "phase": phase, "domain": domain, "temperature": t, "t_send": 0.0, "t_first": 0.1,
            "t_end": dur, "ok": ok, "completion_tokens": tokens}


def test_one_fleet_fastest_everywhere_leaves_no_room():
    fleets = {"all-mtp": [req(0), req(1, domain="chat")],
              "all-dfly": [req(0, dur=2.0), req(1, domain="chat", dur=1.5)]}
    c = cell_ceiling(fleets)
    co = c["class_oracle"]
    assert co["best_fleet"] == "all-mtp" and co["gain_over_best_fleet"] == 0.0
    assert co["estimated_time_vs_best"] == {"all-dfly": 1.75, "all-mtp": 1.0}
    assert co["token_share_by_fastest_fleet"] == {"all-mtp": 1.0}
    assert co["fastest"] == {"0:code|t=0": "all-mtp", "0:chat|t=0": "all-mtp"}
    assert c["request_oracle"]["gain_over_best_fleet"] == 0.0 and "fastest" not in c["request_oracle"]


def test_classes_split_between_fleets_give_the_oracle_its_gain():
    # code: dfly 1 s, mtp 2 s; chat: mtp 1 s, dfly 3 s; same tokens. mtp 3 s in all, dfly 4 s, oracle 2 s
    fleets = {"all-mtp": [req(0, dur=2.0), req(1, domain="chat")],
              "all-dfly": [req(0), req(1, domain="chat", dur=3.0)],
              "learned": [req(0, dur=0.1)]}   # not a fleet: ignored
    co = oracle(fleets, lambda r: f"{r['phase']}:{r['domain']}", detail=True)
    assert co is not None
    assert co["best_fleet"] == "all-mtp" and co["gain_over_best_fleet"] == 0.5
    assert co["oracle_to_fleet"] == {"all-dfly": 0.5, "all-mtp": pytest.approx(0.6667, abs=1e-4)}
    assert co["token_share_by_fastest_fleet"] == {"all-dfly": 0.5, "all-mtp": 0.5}


def test_time_per_token_weighs_requests_by_their_tokens_and_skips_failures():
    # one class, two requests: mtp 1 s for 10 + 3 s for 30 tokens = 0.1 s/token; ar 0.08 s/token
    fleets = {"all-mtp": [req(0, dur=1.0), req(1, dur=3.0, tokens=30)],
              "all-ar": [req(0, dur=0.8), req(1, dur=2.4, tokens=30), req(2, ok=False, dur=9.0)]}
    co = cell_ceiling(fleets)["class_oracle"]
    assert co["best_fleet"] == "all-ar" and co["gain_over_best_fleet"] == 0.0
    assert co["estimated_time_vs_best"]["all-mtp"] == 1.25
    # by request, request 2 failed on the AR fleet and ran on no other: it is in no estimate
    ro = oracle(fleets, request_unit)
    assert ro is not None and ro["units"] == 2


def test_no_oracle_without_two_fleets_and_the_suite_scales_the_best_fleets_time():
    assert oracle({"all-mtp": [req(0)]}, request_unit) is None
    assert cell_ceiling({"all-mtp": [req(0)], "learned": [req(0)]}) == {"class_oracle": None, "request_oracle": None}
    cells = [({"class_oracle": {"oracle_to_fleet": {"all-mtp": 0.5}}, "request_oracle": None}, {"all-mtp": 10.0}),
             ({"class_oracle": {"oracle_to_fleet": {"all-mtp": 1.0}}, "request_oracle": None}, {"all-mtp": 30.0}),
             ({"class_oracle": None, "request_oracle": None}, {"all-mtp": 99.0})]
    s = suite_ceiling(cells, "all-mtp")
    assert s == {"fleet": "all-mtp", "class_oracle": round(40 / 35 - 1, 4), "request_oracle": None}
