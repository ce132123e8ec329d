"""`specroute bench side` (bench/side.py): arm parsing, the paired round ratio, and a run of our own arms on a
tiny random bundle (the vLLM arms run in .venv-vllm: tests/vllm)."""

from __future__ import annotations

import json

import pytest

from bench.side import main, paired_ratio, parse_arm, rotated
from specroute.errors import UserError
from tests.engines.worker.bundle import tiny_bundle


def test_arm_parsing():
    assert parse_arm("ar") == ("ar", None, None)
    assert parse_arm("vllm:none") == ("vllm", "none", None)
    assert parse_arm("vllm:draft_model=/m/small") == ("vllm", "draft_model", "/m/small")
    assert parse_arm("dfly+dcut") == ("dfly+dcut", None, None)
    for bad in ("vllm:dfly", "vllm:dflash", "ar:x", "eagle", "ar+dcut", "dfly+x"):
        with pytest.raises(UserError):
            parse_arm(bad)


def test_paired_ratio_and_rotation():
    assert paired_ratio([10.0, 12.0, 9.0], [10.0, 10.0, 10.0]) == {"median": 1.0, "min": 0.9, "max": 1.2,
                                                                  "rounds": [1.0, 1.2, 0.9]}
    assert paired_ratio([1.0], [0.0])["rounds"] == []
    assert rotated([1, 2, 3], 1) == [2, 3, 1] and rotated([1, 2, 3], 3) == [1, 2, 3]


def test_side_by_side_of_our_arms(tmp_path):
    model = tiny_bundle(tmp_path / "m", drafters=("mtp",))
    out = tmp_path / "side.json"
    assert main(["--model", str(model), "--arms", "ar,mtp,mtp+dcut", "--concurrency", "1,2", "--requests", "3", "--rounds", "2",
                 "--max-tokens", "6", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {(r["arm"], r["concurrency"]) for r in doc["rows"]} == {(a, c) for a in ("ar", "mtp", "mtp+dcut") for c in (1, 2)}
    for r in doc["rows"]:
        assert len(r["rounds_tokens_per_s"]) == 2 and r["requests"] == 6 and r["lossless_failures"] == 0
        assert r["tokens_per_s_min"] <= r["tokens_per_s_median"] <= r["tokens_per_s_max"]
    assert doc["failed"] == {} and doc["ar_vs_vllm"] == {}
    with pytest.raises(UserError, match="needs ar"):
        main(["--model", str(model), "--arms", "mtp", "--out", str(out)])
