"""`specroute classifier train|eval`: report schemas, artifact round trip, user errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from classifier import Classifier
from classifier import train as T
from classifier.data import read_prompt_dir
from specroute.cli import main as specroute_main

from .conftest import CHAT, CODE, FIXTURE_PROMPTS, MATH, write_prompts


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
    assert set(rep["per_language"]) == {"en"}
    table = rep["per_source_table"]["alpha"]
    assert {"n", "accuracy", "macro_f1", "ece", "domains"} <= table.keys()
    assert {"auroc_entropy", "auroc_one_minus_max_prob", "n_wrong"} <= rep["uncertainty"].keys()
    checks = {c["text"]: c for c in rep["unseen_checks"]}
    assert checks["What is 12 * 7?"]["expected"] == "math"
    assert all(c["ok"] for c in rep["unseen_checks"]), [c for c in rep["unseen_checks"] if not c["ok"]]


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


def _two_language_prompts(folder: Path) -> Path:
    rows = []
    for lang in ("en", "de"):
        for k, source in enumerate(("alpha", "beta", "gamma")):
            for domain, texts in (("chat", CHAT), ("code", CODE), ("math", MATH)):
                for j, text in enumerate(texts):
                    if j % 3 == k or j % 2 == k % 2:
                        row = {"id": f"{source}/{lang}/{domain}{j}", "source": source, "domain": domain}
                        row["prompt"] = text if lang == "en" else f"Bitte: {text}"
                        if lang != "en":
                            row["lang"] = lang
                        rows.append(row)
    return write_prompts(folder, rows)


def test_train_reports_leave_one_language_out(tmp_path: Path):
    folder = _two_language_prompts(tmp_path / "p")
    report = tmp_path / "report.json"
    argv = ["classifier", "train", "--data", str(folder), "--no-extra", "--skip-latency"]
    assert specroute_main([*argv, "--artifact", str(tmp_path / "a.npz"), "--report", str(report)]) == 0
    rep = json.loads(report.read_text())
    lolo = rep["leave_one_language_out"]
    assert set(lolo["per_language"]) == {"en", "de"}
    assert lolo["per_language"]["de"]["n"] == rep["training"]["n_prompts"] // 2
    assert {"accuracy", "macro_f1", "n"} <= lolo["per_source_table"]["alpha"].keys()
    assert set(rep["leave_one_source_out"]["per_language"]) == {"en", "de"}
    acceptance = rep["acceptance"]
    assert set(acceptance) == {
        "lolo_macro_f1",
        "loso_macro_f1",
        "ece",
        "uncertainty_auroc",
        "latency_cpu_p99_4kb_us",
        "latency_cpu_p99_100kb_us",
    }
    assert acceptance["lolo_macro_f1"]["value"] == lolo["macro_f1"]
    assert acceptance["latency_cpu_p99_4kb_us"]["met"] is None  # --skip-latency


def test_leave_one_language_out_never_trains_on_the_held_out_language(tmp_path: Path, monkeypatch):
    folder = _two_language_prompts(tmp_path / "p")
    data = T.load_training_data(str(folder), None, extra=False)
    seen: list[set[str]] = []
    real_fit = T.fit

    def spy(examples, m, idx, cfg):
        seen.append({examples[i].lang for i in idx})
        return real_fit(examples, m, idx, cfg)

    monkeypatch.setattr(T, "fit", spy)
    idx, logits, fold = T.leave_one_language_out(data, T.TrainConfig(), log=lambda _: None)
    assert seen == [{"en"}, {"de"}]  # folds in language order: de held out, then en
    assert len(idx) == len(data.examples) and logits.shape == (len(idx), 3)
    assert sorted(set(fold.tolist())) == [0, 1]


def _translated_prompts(folder: Path) -> Path:
    """English prompts, and German ones of which every other one translates an English item (MT-Bench
    style ids: `alpha/7` and `alpha/de-7` are one item)."""
    rows = []
    for k, source in enumerate(("alpha", "beta", "gamma")):
        for domain, texts in (("chat", CHAT), ("code", CODE), ("math", MATH)):
            for j, text in enumerate(texts):
                if j % 3 == k or j % 2 == k % 2:
                    rows.append({"id": f"{source}/{domain}{j}", "source": source, "domain": domain, "prompt": text})
                    tail = f"{domain}{j}" if j % 2 == 0 else f"{domain}{j}x"
                    rows.append({"id": f"{source}/de-{tail}", "source": source, "domain": domain,
                                 "prompt": f"Bitte: {text}", "lang": "de"})
    return write_prompts(folder, rows)


def test_grouped_folds_hold_translations_out_with_the_item(tmp_path: Path, monkeypatch):
    from classifier.data import family

    data = T.load_training_data(str(_translated_prompts(tmp_path / "p")), None, extra=False)
    ex = data.examples
    assert family(next(e for e in ex if e.id == "alpha/de-chat0")) == "alpha/chat0"
    trained: list[set[str]] = []
    real_fit = T.fit

    def spy(examples, m, idx, cfg):
        trained.append({family(examples[i]) for i in idx})
        return real_fit(examples, m, idx, cfg)

    monkeypatch.setattr(T, "fit", spy)
    de_families = {family(e) for e in ex if e.lang == "de"}
    twins = {family(e) for e in ex if e.lang == "en"} & de_families
    assert twins  # the data has translations
    T.leave_one_language_out(data, T.TrainConfig(), log=lambda _: None, grouped=True)
    assert not trained[0] & de_families  # holding German out holds its English originals out too
    trained.clear()
    T.leave_one_language_out(data, T.TrainConfig(), log=lambda _: None, grouped=False)
    assert trained[0] & twins == twins  # the old folds trained on them


def test_nested_temperatures_never_use_the_fold_they_score():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(60, 3)) * 3
    y = rng.integers(0, 3, 60)
    fold = np.repeat([0, 1, 2], 20)
    temps = T.nested_temperatures(logits, y, fold)
    for k in range(3):
        mask = fold == k
        assert np.allclose(temps[mask], T.fit_temperature(logits[~mask], y[~mask]))
    y2 = y.copy()
    y2[fold == 0] = (y2[fold == 0] + 1) % 3  # fold 0's labels change: its own temperature does not
    assert np.allclose(T.nested_temperatures(logits, y2, fold)[fold == 0], temps[fold == 0])
    assert not np.allclose(T.nested_temperatures(logits, y2, fold)[fold == 1], temps[fold == 1])


def test_cv_reports_grouped_and_ungrouped_with_nested_calibration(tmp_path: Path):
    out = tmp_path / "cv.json"
    folder = _translated_prompts(tmp_path / "p")
    assert specroute_main(["classifier", "cv", "--data", str(folder), "--corpus", str(tmp_path / "none"),
                           "--schemes", "language,script", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert set(rep["results"]) == {"leave_one_language_out", "leave_one_script_out",
                                   "leave_one_language_out_ungrouped", "leave_one_script_out_ungrouped"}
    lolo = rep["results"]["leave_one_language_out"]
    assert set(lolo["per_language"]) == {"en", "de"} and set(lolo["per_script"]) == {"latin"}
    assert 0.0 <= lolo["ece"] <= 1.0 and 0.0 <= lolo["ece_pooled_temperature"] <= 1.0
    assert len(lolo["temperature_nested"]) == 2  # one per held-out language
    assert rep["acceptance"]["leave_one_language_out_macro_f1"]["value"] == lolo["macro_f1"]


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


def test_dropped_dense_features_get_no_weight(tiny_prompts: Path):
    """`TrainConfig.drop_dense`: the script-dependent ASCII shares carry no weight in the shipped config,
    and a feature the config keeps does."""
    from classifier import features as F

    examples, _ = read_prompt_dir(tiny_prompts)
    m = T.featurise(examples)
    cfg = T.TrainConfig()
    assert set(cfg.drop_dense) == {"share_upper", "share_lower", "share_non_ascii"}
    fitted = T.fit(examples, m, np.arange(len(examples)), cfg)
    cols = [F.DENSE_NAMES.index(n) for n in cfg.drop_dense]
    assert np.all(fitted.w_dense[:, cols] == 0.0)
    kept = T.fit(examples, m, np.arange(len(examples)), T.TrainConfig(drop_dense=()))
    assert np.any(kept.w_dense[:, cols] != 0.0)


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
    """Accurate and calibrated on the English and on the non-English items alike (the shipped model
    is trained on every language of the data, these items included)."""
    from classifier.metrics import ece

    examples, _ = read_prompt_dir(FIXTURE_PROMPTS)
    english = _english_ids(FIXTURE_PROMPTS)
    assert {e.lang for e in examples if e.id in english} == {"en"}
    assert len({e.lang for e in examples if e.id not in english}) == 12
    clf = Classifier.load()
    for subset in (True, False):
        sample = [e for e in examples if (e.id in english) == subset]
        assert len(sample) >= 200
        probs = np.array(
            [[clf.classify(e.request).probabilities[k] for k in ("chat", "code", "math")] for e in sample]
        )
        y = np.array([("chat", "code", "math").index(e.label) for e in sample])
        assert (probs.argmax(1) == y).mean() > 0.95
        assert ece(probs, y) < 0.05
