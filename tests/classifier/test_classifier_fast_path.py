"""The fast feature scan and scorer reproduce the reference formulation exactly; the eval times it.

`classifier.features.scan` (`classifier.features.fast`) reorganises the feature computation (shared pair tables, packed counts, one
bincount, keys written in place) and `Classifier.classify` folds the standardisation into the weights.
Neither may change a feature or a probability: the shipped artifact was trained on the reference
features (`reference_features.py`, the original implementation).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from classifier import Classifier, default_classifier
from classifier import features as F
from classifier.data import read_prompt_dir
from classifier.evaluate import measure_latency
from classifier.features import hashing as H
from classifier.features import tables as T
from classifier.model import LABELS, junk_weight
from specroute.cli import main as specroute_main

from . import reference_features as R
from .conftest import CHAT, CODE, FIXTURE_PROMPTS, MATH

TRICKY = [
    "",
    " ",
    "a",
    ".",
    "ab",
    "x=1",
    "0+0",
    "\x00",
    "é",
    "日本語",
    "a.b_c(d) x = (1) camelCase snake_case obj.attr f(x)",
    "$5 and $$x^2$$ \\frac{1}{2} \\(a\\) 50% <div class='x'>hi</div> <br/>",
    "```python\nimport os\n\ndef main():\n\treturn os.getcwd()  # cwd\n```\n",
    "\ud800abc \udfff",
    "\ufffd" * 5,
    "\ue000 private \U000f0001 use",
    "1+2=3, 4 * 5 = 20, y=(3+4), a_1 = b_2",
    "😀 " * 40,
    "日本語のテキスト" * 20,  # more than 64 non-ASCII characters: the vectorised path
    # non-ASCII code points whose 4093-bin shares an ASCII character's bin (a) or another's
    "a" + chr(4093 + 97) + " bc " + chr(2 * 4093 + 300) + chr(4093 + 300) + chr(300) + chr(4093 + 97),
    "line\n\n\nblank lines\r\n\x0b\x0cend",
    # scripts without spaces (a word per character, ASCII right after one starts a word), case
    # folding in every script (some change length), folded marks and digits
    "共3个苹果，用python写一个函数。",
    "😀abc 😀0 é0 déjà vu",
    "¿Cómo está? 12 × 7 = 84 ÷ 2 − 1 ≤ 3",
    "ＡＢＣ１２３＝４＋５ （全角）",
    "١٢٣ + ٤ = ١٢٧ ، ما هو؟",
    "КАК ДЕЛА? İstanbul ǅ ß ΣΑΣ",
    "người Việt Nam năm 2012 bao nhiêu?",
    "ฟังก์ชัน 12 × 3 เท่าไร",
    "日本語のテキスト、りんごを3個。" * 10,
    # digits and operators only as folded marks (no ASCII digit or operator in the raw bytes)
    "٣×٤ ÷٢",
    "س٣×٤",
    "ok  two  spaces\t\ttabs\n\n",
]


def _same(text: str, full_len: int | None = None) -> None:
    got, ref = F.extract(text, full_len), R.extract(text, full_len)
    np.testing.assert_allclose(got.dense, ref.dense, rtol=0, atol=1e-12)
    assert got.junk == ref.junk
    assert got.buckets.dtype == np.intp
    assert np.array_equal(np.sort(got.buckets), np.sort(ref.buckets))


@pytest.mark.parametrize("text", TRICKY + CHAT + CODE + MATH)
def test_scan_matches_reference_on_tricky_text(text: str):
    _same(text)
    _same(text, 10 * len(text) + 7)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(
        alphabet=st.sampled_from(
            list("abZ09 _.(=+-*/^<>\n\t\r$\\{}[]`'\"#@%é日\x00\x7f\ufffd😀共ЖİÉ¿×÷，。？١ạ")
        ),
        max_size=400,
    )
)
def test_scan_matches_reference_on_pattern_soup(text: str):
    _same(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=F.MAX_SAMPLE_CHARS))
def test_scan_matches_reference_on_any_text(text: str):
    _same(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_fold_spaces_is_fold_ws(raw: bytes):
    assert H.fold_spaces(raw.translate(H.LOWER_FOLD_WS)) == H.fold_ws(raw.translate(H.LOWER_FOLD))


def test_operands_are_read_only_0d():
    for name in dir(T):
        if name.startswith("OP_"):
            for op in getattr(T, name) if isinstance(getattr(T, name), tuple) else (getattr(T, name),):
                assert op.ndim == 0 and not op.flags.writeable


def test_scan_and_scoring_match_reference_on_fixture_prompts():
    """Features and probabilities of every fixture prompt (every source, 13 languages, some long ones):
    the fast path against the reference features scored by the reference formulation."""
    clf = default_classifier()
    examples, _ = read_prompt_dir(FIXTURE_PROMPTS)
    assert len(examples) >= 600
    for ex in examples:
        sample, full_len = F.request_text(ex.request)
        _same(sample, full_len)
        got = clf.classify(ex.request)
        if not any(c.isalnum() for c in sample):
            assert got.uncertainty == 1.0
            continue
        want = _reference_probabilities(clf, sample, full_len)
        assert np.allclose([got.probabilities[k] for k in LABELS], want, rtol=0, atol=1e-12)
        assert got.label == LABELS[int(np.argmax(want))]


def test_long_samples_are_read_head_and_tail():
    text = "HEAD " + "def f(x):\n    return x + 1\n" * 400 + " TAIL"
    a = F.scan(text, len(text))
    b = F.scan(F.head_tail(text), len(text))
    assert a is not None and b is not None
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def _reference_probabilities(clf: Classifier, text: str, full_len: int | None = None) -> list[float]:
    """Probabilities of the reference formulation: of `text` as a request, or of a sample (`full_len`)."""
    sample, full_len = F.request_text(text) if full_len is None else (text, full_len)
    feats = R.extract(sample, full_len)
    p = clf.probabilities(feats)
    w = junk_weight(feats.junk)
    return ((1.0 - w) * p + w / 3.0).tolist()


@pytest.mark.parametrize("text", [t for t in TRICKY if any(c.isalnum() for c in t)] + CHAT + CODE + MATH)
def test_fast_scoring_matches_reference_scoring(text: str):
    clf = default_classifier()
    got = clf.classify(text)
    want = _reference_probabilities(clf, text)
    assert np.allclose([got.probabilities[k] for k in ("chat", "code", "math")], want, rtol=0, atol=1e-12)


def test_measure_latency_reports_method_and_pinning():
    lat = measure_latency(default_classifier(), CHAT + CODE + MATH, repeats=2, n_100kb=3)
    assert lat.n == 2 * len(CHAT + CODE + MATH)
    assert 0 < lat.p50 <= lat.p99 <= lat.p999 <= lat.max
    assert lat.by_length["100KB"].n == 3 and lat.p99_100kb > 0
    assert "perf_counter_ns" in lat.method and "garbage collector disabled" in lat.method
    if lat.cpu_affinity is not None:
        assert len(lat.cpu_affinity) == 1


def test_eval_json_has_latency_method(tiny_prompts: Path, tmp_path: Path, capsys):
    out = tmp_path / "eval.json"
    argv = ["classifier", "eval", "--data", str(tiny_prompts), "--out", str(out), "--repeats", "1"]
    assert specroute_main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["latency_method"] == rep["latency_us"]["method"]
    printed = capsys.readouterr().out
    assert "p50=" in printed and "p99=" in printed and "p99_100kb=" in printed


def test_classify_is_cheap():
    """A loose guard against regressions to per-call costs in the milliseconds (CPU time, median)."""
    clf = default_classifier()
    texts = CHAT + CODE + MATH
    for t in texts:
        clf.classify(t)
    samples = []
    for _ in range(20):
        for t in texts:
            c0 = time.thread_time_ns()
            clf.classify(t)
            samples.append(time.thread_time_ns() - c0)
    assert float(np.median(samples)) / 1000.0 < 500.0
    assert math.isfinite(float(np.max(samples)))
