"""`specroute bench served` end to end on a tiny random bundle: three real gRPC workers, one request
at a time, every output equal to AR's."""

from __future__ import annotations

import json

import pytest

from bench.served import main
from tests.engines.worker.bundle import tiny_bundle


@pytest.mark.e2e
def test_bench_served_compares_dcut_with_plain_and_ar(tmp_path):
    model = tiny_bundle(tmp_path / "m", drafters=("dfly",))
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--per-domain", "1", "--max-tokens", "8", "--block-size", "4",
               "--profile-dir", str(tmp_path / "prof"), "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "served.json").read_text())
    assert doc["meta"]["lossless_mismatches_vs_ar"] == 0
    for cell in doc["domains"].values():
        assert {"ar", "dfly", "dfly+dcut", "dcut_over_plain"} <= set(cell)
        assert cell["ar"]["requests"] == cell["dfly+dcut"]["requests"] == 1
        assert cell["dfly"]["mal_mean"] >= 1.0
