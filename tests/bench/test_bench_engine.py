"""`specroute bench engine` end to end on a tiny random bundle (in-process batcher, JSON + PNG)."""

from __future__ import annotations

import json

import pytest

from bench.engine import main, parse_engine, parse_list
from specroute.errors import UserError
from tests.engines.worker.bundle import tiny_bundle

COLUMNS = {"engine", "dcut", "concurrency", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
           "itl_p99_ms", "mean_accepted_length", "kept_ratio"}


def test_engine_list_parsing():
    assert parse_list("ar, mtp dfly+dcut") == ["ar", "mtp", "dfly+dcut"]
    assert parse_engine("dfly+dcut") == ("dfly", True)
    with pytest.raises(UserError):
        parse_engine("ar+dcut")
    with pytest.raises(UserError):
        parse_engine("eagle")


def test_bench_engine_writes_json_and_png(tmp_path):
    model = tiny_bundle(tmp_path / "m", drafters=("dfly",))
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--engines", "ar,dfly,dfly+dcut", "--concurrency", "1,3", "--requests", "4",
               "--max-tokens", "8", "--threads", "1", "--profile-dir", str(tmp_path / "prof"), "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "engine.json").read_text())
    rows = doc["rows"]
    assert {(r["engine"], r["dcut"], r["concurrency"]) for r in rows} == {
        (e, d, c) for e, d in (("ar", False), ("dfly", False), ("dfly", True)) for c in (1, 3)}
    for r in rows:
        assert set(r) >= COLUMNS and r["output_tokens_per_s"] > 0 and r["lossless_failures"] == 0
    assert (out / "engine.png").stat().st_size > 1000


def test_missing_drafter_is_a_clear_error(tmp_path):
    model = tiny_bundle(tmp_path / "m")
    with pytest.raises(UserError, match="no mtp drafter"):
        main(["--model", str(model), "--engines", "mtp", "--out", str(tmp_path)])


def test_bench_dcut_writes_budget_table(tmp_path):
    from bench.dcut import main as dcut_main

    model = tiny_bundle(tmp_path / "m", drafters=("dfly",))
    out = tmp_path / "out"
    assert dcut_main(["--model", str(model), "--batch", "4", "--prompts", "6", "--max-tokens", "8",
                      "--profile-dir", str(tmp_path / "prof"), "--out", str(out)]) == 0
    doc = json.loads((out / "dcut.json").read_text())
    assert [r["ratio"] for r in doc["rows"]] == [0.25, 0.5, 0.75, 1.0]
    full = doc["rows"][-1]
    assert full["fixed_verify_tokens"] == full["dcut_verify_tokens"] and full["fixed_accepted"] == full["dcut_accepted"]
    assert (out / "dcut.png").is_file()
