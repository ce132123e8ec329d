"""`specroute bench acceptance` end to end on a tiny bundle: JSON rows with the documented fields,
a PNG, the lossless check at temperature 0 on drafts that are accepted and rejected, and the
low-acceptance flag."""

from __future__ import annotations

import json

import pytest
import torch

from bench.acceptance import AcceptanceReport
from specroute.cli import main as specroute
from tests.tiny_bundle import make_tiny_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The tiny bundle, its random drafters' draft vocabulary narrowed to the two tokens the target
    emits most on the benchmark's own prompts: over the full vocabulary a random drafter accepts
    nothing, and the lossless check would only ever see rejected drafts."""
    from collections import Counter

    from bench.acceptance import select_prompts
    from engines.drafters.registry import load_drafter, save_drafter
    from engines.generate import ar_generate
    from engines.model import load_model
    from engines.sampling import SamplingParams
    from engines.tokenizer import Tokenizer

    torch.set_num_threads(1)
    path = make_tiny_bundle(tmp_path_factory.mktemp("bundle"), drafters=("mtp", "dfly"))
    target, tok = load_model(path), Tokenizer.load(path)
    greedy = Counter(t for ps in select_prompts(tok, 2, 512, 0).values() for p in ps
                     for t in ar_generate(target, tok, p, SamplingParams(), max_tokens=8).token_ids)
    common = torch.tensor([t for t, _ in greedy.most_common(2)])
    for kind in ("mtp", "dfly"):
        d = load_drafter(kind, path, target)
        d.set_draft_vocab(common)
        save_drafter(d, path / "drafters" / kind, dtype=torch.float32)
    return path


def test_acceptance_benchmark_writes_rows_and_chart(bundle, tmp_path, capsys):
    out = tmp_path / "results"
    rc = specroute(["bench", "acceptance", "--model", str(bundle), "--out", str(out), "--prompts", "2",
                    "--prompts-hot", "1", "--max-tokens", "8", "--threads", "1", "--blocks", "8",
                    "--exactness-samples", "60"])
    assert rc == 0
    report = AcceptanceReport.model_validate(json.loads((out / "acceptance.json").read_text()))
    assert (out / "acceptance.png").stat().st_size > 10_000
    # dflash is absent from this bundle: skipped; mtp k=3 and dfly block 8 x 3 domains x 3 temperatures
    assert len(report.rows) == 2 * 3 * 3
    assert sorted({r.temperature for r in report.rows}) == [0.0, 0.7, 1.0]
    assert {(r.drafter, r.block) for r in report.rows} == {("mtp", 4), ("dfly", 8)}
    for r in report.rows:
        d = r.model_dump()
        for f in ("drafter", "block", "domain", "temperature", "mean_accepted_length", "tokens_per_s",
                  "ar_tokens_per_s", "speedup", "prompts", "lossless_checked", "lossless_mismatches"):
            assert f in d
        assert r.lossless_mismatches == 0
        assert r.lossless_checked == (2 if r.temperature == 0 else 0)
        assert r.prompts == (2 if r.temperature == 0 else 1)
        assert 1.0 <= r.mean_accepted_length <= r.k + 1
        assert r.low_acceptance == (r.mean_accepted_length < 1.3)
        assert len(r.acceptance_per_position) <= r.k
        assert r.drafting == ("sampled" if r.temperature > 0 else "greedy")   # the default at T > 0
        assert (r.exactness_p is not None and 0.0 <= r.exactness_p <= 1.0 and r.exactness_samples == 60) \
            if r.temperature > 0 else (r.exactness_p is None and r.exactness_samples == 0)
    greedy = [r for r in report.rows if r.temperature == 0]
    for kind in ("mtp", "dfly"):   # drafts were accepted, and every output still matched greedy AR
        assert max(r.mean_accepted_length for r in greedy if r.drafter == kind) > 1.0, kind
    assert "no dflash drafter" in capsys.readouterr().err


def test_acceptance_benchmark_without_drafters_is_a_user_error(tmp_path, capsys):
    bundle = make_tiny_bundle(tmp_path / "b", drafters=())
    assert specroute(["bench", "acceptance", "--model", str(bundle), "--out", str(tmp_path / "o")]) == 2
    assert "no drafters found" in capsys.readouterr().err


def test_schema_rows_sit_beside_the_unconstrained_ones(bundle, tmp_path):
    out = tmp_path / "results"
    rc = specroute(["bench", "acceptance", "--model", str(bundle), "--out", str(out), "--prompts", "2",
                    "--temperatures", "0", "--max-tokens", "8", "--threads", "1", "--blocks", "8",
                    "--drafters", "mtp,dfly", "--schema"])
    assert rc == 0
    rows = AcceptanceReport.model_validate(json.loads((out / "acceptance.json").read_text())).rows
    plain = {(r.drafter, r.domain) for r in rows if r.constraint == "none"}
    constrained = [r for r in rows if r.constraint == "json_schema"]
    assert {(r.drafter, r.domain) for r in constrained} == plain and len(plain) == 2 * 3
    for r in constrained:   # token-identical to AR's constrained greedy output on every prompt
        assert r.temperature == 0 and r.lossless_checked == 2 and r.lossless_mismatches == 0
        assert 1.0 <= r.mean_accepted_length <= r.k + 1
