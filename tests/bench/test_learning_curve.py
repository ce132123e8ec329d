"""`bench learning-curve` (bench/learning_curve.py): the fit, the extrapolation and the n-gram baseline."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.learning_curve import extrapolate, fit, main, ngram_baseline
from specroute.errors import UserError


def _report(tokens: int, tau: float, gen_s: float) -> dict:
    held = {d: {"tau": tau, "acc": [tau - 1]} for d in ("chat", "code", "math")}
    return {"summary": {"steps": 100, "heldout": {"k3": held}},
            "recipe": {"data": {"response_tokens": tokens, "generation_seconds": gen_s}}}


def test_the_fit_and_the_tokens_a_target_needs() -> None:
    a, b = fit([10.0, 11.0, 12.0], [0.2, 0.3, 0.4])
    assert b == pytest.approx(0.1) and a == pytest.approx(-0.8)
    points = [{"response_tokens": 1024, "generation_seconds": 100.0, "tau": {"code": 1.2}},
              {"response_tokens": 4096, "generation_seconds": 200.0, "tau": {"code": 1.4}}]
    out = extrapolate(points, {"code": 1.7}, [1.0, 3.0])
    assert out["generation_tokens_per_s"] == pytest.approx(30.7)   # (4096 - 1024) / 100 s beats 1024 / 100 s
    slow, fast = out["domains"]["code"]["needed"]
    assert slow["doublings"] == pytest.approx(3.0) and slow["tokens"] == pytest.approx(4096 * 8, rel=0.01)
    assert fast["doublings"] == pytest.approx(1.0) and fast["times_the_last_run"] == 2
    with pytest.raises(UserError):
        fit([1.0, 1.0], [0.1, 0.2])


def test_the_ngram_baseline_learns_a_repeated_answer(tmp_path: Path) -> None:
    toks = [1, 2, 3, 4, 5, 6]
    part = {"ids": [], "domains": ["code"] * 20, "prompt_lens": [1] * 20, "tokens": [[0, *toks]] * 20}
    (tmp_path / "selfdistill_x-code0000-0020.json.gz").write_bytes(gzip.compress(json.dumps(part).encode()))
    got = ngram_baseline(tmp_path)
    assert got["held_out_answers"] == 2 and got["acc1"]["code"]["trigram_backoff"] == 1.0


def test_the_command_writes_its_file(tmp_path: Path) -> None:
    files = []
    for i, (tokens, tau) in enumerate([(1000, 1.4), (4000, 1.6)]):
        f = tmp_path / f"r{i}.json"
        f.write_text(json.dumps(_report(tokens, tau, 100.0 * (i + 1))))
        files.append(str(f))
    out = tmp_path / "lc.json"
    assert main(["--report", files[0], "--report", f"{files[1]}=second", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert [p["label"] for p in res["points"]] == [files[0], "second"]
    assert res["extrapolation"]["domains"]["chat"]["slope_per_doubling"] == pytest.approx(0.1)
