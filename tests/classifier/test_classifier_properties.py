"""Bad input never raises and gives a valid answer (hypothesis property tests)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from classifier import Classifier, Prediction, default_classifier

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def clf() -> Classifier:
    return default_classifier()


def _valid(pred: Prediction) -> None:
    label, probs, unc = pred
    assert label in ("chat", "code", "math")
    assert set(probs) == {"chat", "code", "math"}
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs.values())
    assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-9)
    assert math.isfinite(unc) and 0.0 <= unc <= 1.0


@SETTINGS
@given(text=st.text())
def test_any_text(text: str):
    _valid(default_classifier().classify(text))


@SETTINGS
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=5000))
def test_any_unicode_including_surrogates(text: str):
    _valid(default_classifier().classify([{"role": "user", "content": text}]))


@SETTINGS
@given(data=st.binary(max_size=5000))
def test_any_bytes(data: bytes):
    _valid(default_classifier().classify(data))


@SETTINGS
@given(text=st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003\u3000", max_size=200))
def test_whitespace_only_is_maximally_uncertain(text: str):
    pred = default_classifier().classify(text)
    _valid(pred)
    assert pred.uncertainty == 1.0


content = st.one_of(
    st.none(),
    st.text(),
    st.binary(),
    st.integers(),
    st.lists(st.one_of(st.text(), st.dictionaries(st.text(max_size=5), st.text(max_size=50))), max_size=4),
)
message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "x"]), "content": content}
    ),
    st.dictionaries(st.text(max_size=8), content, max_size=3),
    st.text(),
    st.none(),
    st.integers(),
)


@SETTINGS
@given(messages=st.lists(message, max_size=8))
def test_any_message_list(messages):
    _valid(default_classifier().classify(messages))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(256, 20_000))
def test_binary_garbage_is_uncertain(seed: int, n: int):
    data = random.Random(seed).randbytes(n)
    pred = default_classifier().classify(data)
    _valid(pred)
    assert pred.uncertainty > 0.9


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [
                "Bonjour, comment ça va ?",
                "日本語で説明してください。",
                "Привет, как дела?",
                "مرحبا كيف حالك",
                "😀🎉🔥",
                "👩‍💻 code review?",
                "x² + y² = z²",
                "∑_{i=1}^{n} i",
                "नमस्ते",
                "ok",
                "\u200b\u200d",
            ]
        ),
        min_size=1,
        max_size=12,
    )
)
def test_mixed_languages_scripts_and_emoji(parts):
    _valid(default_classifier().classify(" ".join(parts)))


def test_emoji_only_is_valid(clf: Classifier):
    _valid(clf.classify("😀" * 1000))


@pytest.mark.parametrize("size", [1_000_000, 5_000_000])
def test_megabytes_of_text(clf: Classifier, size: int):
    for text in ("a" * size, ("def f(x):\n    return x\n" * (size // 24)), "\x00" * size):
        _valid(clf.classify(text))
        _valid(clf.classify([{"role": "user", "content": text}]))
    big = random.Random(0).randbytes(size)
    _valid(clf.classify(big))


def test_lone_surrogates_and_nul(clf: Classifier):
    for text in ("\ud800abc", "def f():\udfff return 1", "\x00\x01\x02 hello", "\ufffd" * 50):
        _valid(clf.classify(text))
