"""`specroute classifier train|eval`: report schemas, artifact round trip, user errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from classifier import Classifier
from classifier import train as T
from classifier.data import read_prompt_dir
from specroute.cli import main as specroute_main

from .conftest import FIXTURE_PROMPTS, write_prompts


def test_eval_writes_the_documented_schema(tiny_prompts: Path, tmp_path: Path):
    out = tmp_path / "eval.json"
    assert (
        specroute_main(
            ["classifier", "eval", "--data", str(tiny_prompts), "--out", str(out), "--repeats", "1"]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    for key in ("accuracy", "macro_f1", "ece"):
        assert 0.0 <= rep[key] <= 1.0
    assert set(rep["per_source"]) == {"alpha", "beta", "gamma"}
    assert all(0.0 <= v <= 1.0 for v in rep["per_source"].values())
    lat = rep["latency_us"]
    for key in ("p50", "p99", "p99_100kb"):
        assert lat[key] > 0
    assert lat["p50"] <= lat["p99"]
    assert rep["accuracy"] >= 0.8  # the shipped model on easy prompts
    assert rep["confusion"]["chat"].keys() == {"chat", "code", "math"}


def test_eval_accepts_messages_records(tmp_path: Path):
    folder = write_prompts(
        tmp_path / "msgs",
        [
            {
                "source": "s",
                "domain": "code",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Write a Python function that sums a list."},
                ],
            },
            {
                "source": "s",
                "domain": "chat",
                "messages": [{"role": "user", "content": "Write a haiku about rain."}],
            },
        ],
    )
    out = tmp_path / "e.json"
    assert (
        specroute_main(["classifier", "eval", "--data", str(folder), "--out", str(out), "--no-latency"]) == 0
    )
    assert json.loads(out.read_text())["accuracy"] == 1.0


def test_eval_user_errors(tmp_path: Path, capsys):
    assert specroute_main(["classifier", "eval", "--data", str(tmp_path / "missing"), "--out", "x.json"]) == 2
    assert "not a folder" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.jsonl").write_text('{"source": "a", "domain": "chat", "prompt": "hi"}\n{"domain": "poetry"}\n')
    assert specroute_main(["classifier", "eval", "--data", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "a.jsonl:2" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        specroute_main(["classifier", "eval", "--data", str(empty), "--out", str(tmp_path / "o.json")]) == 2
    )


def test_train_round_trip(tiny_prompts: Path, tmp_path: Path):
    artifact = tmp_path / "clf.npz"
    report = tmp_path / "report.json"
    rc = specroute_main(
        [
            "classifier",
            "train",
            "--data",
            str(tiny_prompts),
            "--no-extra",
            "--skip-latency",
            "--artifact",
            str(artifact),
            "--report",
            str(report),
        ]
    )
    assert rc == 0
    rep = json.loads(report.read_text())
    assert rep["leave_one_source_out"]["per_source"].keys() == {"alpha", "beta", "gamma"}
    for section in (rep["leave_one_source_out"], rep["random_split"]):
        assert {"accuracy", "macro_f1", "ece", "per_source", "confusion"} <= section.keys()
    assert {"accuracy", "macro_f1", "ece", "per_source", "latency_us"} <= rep.keys()
    assert len(rep["data_hash"]) == 64
    clf = Classifier.load(artifact)
    assert clf.info.data_hash == rep["data_hash"]
    assert clf.classify("Solve $3x + 1 = 10$ for $x$.").label in ("chat", "code", "math")


def test_train_needs_all_domains(tmp_path: Path):
    folder = write_prompts(
        tmp_path / "p",
        [
            {"source": "a", "domain": "chat", "prompt": "hello there"},
            {"source": "b", "domain": "chat", "prompt": "how are you"},
        ],
    )
    rc = specroute_main(
        [
            "classifier",
            "train",
            "--data",
            str(folder),
            "--no-extra",
            "--artifact",
            str(tmp_path / "a.npz"),
            "--report",
            str(tmp_path / "r.json"),
        ]
    )
    assert rc == 2


def test_numpy_scoring_matches_the_training_model(tiny_prompts: Path):
    """The exported arrays + numpy scorer reproduce the fitted model's logits exactly."""
    examples, _ = read_prompt_dir(tiny_prompts)
    m = T.featurise(examples)
    fitted = T.fit(examples, m, np.arange(len(examples)), T.TrainConfig())
    ref = T.softmax(fitted.logits(m, np.arange(len(examples))), 1.3)
    clf = T.to_classifier(fitted, 1.3, {"version": "test"})
    for i, ex in enumerate(examples):
        got = clf.classify(ex.request).probabilities
        assert np.allclose([got["chat"], got["code"], got["math"]], ref[i], atol=1e-7)


def _english_ids(folder: Path) -> set[str]:
    ids = set()
    for file in folder.glob("*.jsonl"):
        with file.open(encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                if "lang" not in rec:
                    ids.add(rec["id"])
    return ids


def test_shipped_model_is_calibrated_on_fixture_prompts():
    """Accurate and calibrated on the English items (the sources the shipped model was trained on);
    on the non-English items, which it never saw, it must still beat a loose floor."""
    from classifier.metrics import ece

    examples, _ = read_prompt_dir(FIXTURE_PROMPTS)
    english = _english_ids(FIXTURE_PROMPTS)
    clf = Classifier.load()
    for subset, min_acc, max_ece in ((True, 0.95, 0.05), (False, 0.6, None)):
        sample = [e for e in examples if (e.id in english) == subset]
        assert len(sample) >= 200
        probs = np.array(
            [[clf.classify(e.request).probabilities[k] for k in ("chat", "code", "math")] for e in sample]
        )
        y = np.array([("chat", "code", "math").index(e.label) for e in sample])
        assert (probs.argmax(1) == y).mean() > min_acc
        if max_ece is not None:
            assert ece(probs, y) < max_ece
