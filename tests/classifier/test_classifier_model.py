"""The shipped artifact and the `classify` API."""

from __future__ import annotations

import json
import math
import zipfile

import numpy as np
import pytest

from classifier import Classifier, Prediction, classify, default_classifier
from classifier import features as F
from classifier.model import ARRAY_NAMES, default_artifact_path


@pytest.fixture(scope="module")
def clf() -> Classifier:
    return default_classifier()


def test_artifact_is_shipped_small_and_pickle_free():
    path = default_artifact_path()
    assert path.is_file()
    assert path.stat().st_size < 5_000_000
    with zipfile.ZipFile(path) as z:
        assert sorted(n.removesuffix(".npy") for n in z.namelist()) == sorted([*ARRAY_NAMES, "meta_json"])
    with np.load(path, allow_pickle=False) as z:  # would raise on object arrays
        meta = json.loads(bytes(z["meta_json"]).decode())
    assert meta["version"] and len(meta["data_hash"]) == 64
    assert meta["labels"] == ["chat", "code", "math"]


def test_loaded_info(clf: Classifier):
    assert clf.info.version.startswith("1.")
    assert clf.info.feature_version == F.FEATURE_VERSION
    assert len(clf.info.data_hash) == 64


def test_prediction_shape(clf: Classifier):
    pred = clf.classify([{"role": "user", "content": "Write a Python function that reverses a string."}])
    assert isinstance(pred, Prediction)
    label, probs, unc = pred
    assert label in ("chat", "code", "math")
    assert set(probs) == {"chat", "code", "math"}
    assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-9)
    assert all(0.0 <= p <= 1.0 for p in probs.values())
    assert label == max(probs, key=probs.__getitem__)
    assert 0.0 <= unc <= 1.0
    assert math.isclose(pred.p_code_math, probs["code"] + probs["math"])
    assert pred.binary_label in ("chat", "code_math")


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n", "code"),
        ("Write a Python function to check whether a string is a palindrome.", "code"),
        ("How do I center a div with CSS flexbox in my React app?", "code"),
        ("Find all real $x$ such that $x^2 - 5x + 6 = 0$.", "math"),
        ("Sam has 12 apples and gives away 5. How many apples does Sam have left?", "math"),
        ("Write a short poem about autumn leaves.", "chat"),
        ("What is the capital of Australia?", "chat"),
    ],
)
def test_obvious_requests(clf: Classifier, text: str, label: str):
    assert clf.classify(text).label == label
    assert clf.classify([{"role": "user", "content": text}]).label == label


def test_binary_view(clf: Classifier):
    assert clf.classify("Compute $\\int_0^1 x^2 \\, dx$.").binary_label == "code_math"
    assert clf.classify("Tell me a fun fact about penguins.").binary_label == "chat"


def test_module_level_classify_uses_the_shipped_model():
    assert classify("import numpy as np\nx = np.zeros(3)\n").label == "code"
    assert default_classifier() is default_classifier()


def test_multi_turn_follows_the_last_user_turn(clf: Classifier):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Tell me about your day."},
        {"role": "assistant", "content": "It was good!"},
        {"role": "user", "content": "Now write a Python function that merges two sorted lists."},
    ]
    assert clf.classify(messages).label == "code"


def test_empty_input_is_uniform(clf: Classifier):
    for empty in ("", "   \n ", [], [{"role": "user", "content": ""}], None, "?!... ---"):
        label, probs, unc = clf.classify(empty)
        assert unc == 1.0 and label == "chat"
        assert all(math.isclose(p, 1 / 3) for p in probs.values())


def test_confident_on_clear_input(clf: Classifier):
    assert clf.classify("def add(a, b):\n    return a + b\n").uncertainty < 0.5


def test_missing_artifact_and_wrong_features(tmp_path):
    with pytest.raises(FileNotFoundError):
        Classifier.load(tmp_path / "nope.npz")
    src = default_artifact_path()
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta_json"]).decode())
    meta["features"]["hash_bits"] = 12
    arrays["meta_json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match="features"):
        Classifier.load(bad)


def test_readme_example_is_math(clf: Classifier):
    for text in ("What is 12 * 7?", "What is 12*7?", "12 × 7 = ?"):
        assert clf.classify([{"role": "user", "content": text}]).label == "math", text


# The same request in several languages (written for this test, in no data file): the language must
# not flip the domain.
SAME_REQUEST = {
    "math": [
        "Anna has 3 apples and buys 5 more. How many apples does she have now?",
        "Anna hat 3 Äpfel und kauft 5 weitere. Wie viele Äpfel hat sie jetzt?",
        "Anna tiene 3 manzanas y compra 5 más. ¿Cuántas manzanas tiene ahora?",
        "Anna a 3 pommes et en achète 5 de plus. Combien de pommes a-t-elle maintenant ?",
        "У Анны 3 яблока, и она покупает ещё 5. Сколько яблок у неё теперь?",
        "安娜有3个苹果，又买了5个。她现在一共有多少个苹果？",
        "アンナはりんごを3個持っていて、5個買いました。りんごは全部で何個ですか？",
    ],
    "code": [
        "Write a Python function that reverses a string.",
        "Schreibe eine Python-Funktion, die einen String umkehrt.",
        "Escribe una función en Python que invierta una cadena.",
        "Écris une fonction Python qui inverse une chaîne de caractères.",
        "Напишите функцию на Python, которая переворачивает строку.",
        "用Python写一个函数，反转字符串。",
        "文字列を逆にするPythonの関数を書いてください。",
    ],
    "chat": [
        "Who was the first emperor of Rome?",
        "Wer war der erste Kaiser Roms?",
        "¿Quién fue el primer emperador de Roma?",
        "Qui était le premier empereur de Rome ?",
        "Кто был первым императором Рима?",
        "谁是罗马的第一位皇帝？",
        "ローマの最初の皇帝は誰ですか？",
    ],
}


@pytest.mark.parametrize("domain", sorted(SAME_REQUEST))
def test_language_is_no_evidence_of_domain(clf: Classifier, domain: str):
    labels = [clf.classify(text).label for text in SAME_REQUEST[domain]]
    assert labels == [domain] * len(labels), list(zip(SAME_REQUEST[domain], labels, strict=True))


def test_ambiguous_prompt_is_uncertain(clf: Classifier):
    # requests that sit between two domains (code or chat; code or math, in German) get a high
    # uncertainty, obvious ones a low one
    for text in (
        "What is the time complexity of binary search?",
        "Schreibe ein Programm, das die Summe von 1 bis 100 berechnet.",
    ):
        assert clf.classify(text).uncertainty > 0.5, text
    for text in ("Solve for $x$: $2x + 3 = 11$.", "Schreibe ein Gedicht über das Meer."):
        assert clf.classify(text).uncertainty < 0.3, text
