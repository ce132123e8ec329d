"""Feature extraction: request text selection, bounded cost, deterministic hashing."""

from __future__ import annotations

import numpy as np

from classifier import features as F


def test_plain_string_and_bytes():
    assert F.request_text("hello world") == ("hello world", 11)
    sample, n = F.request_text(b"caf\xc3\xa9 \xff")
    assert sample.startswith("café") and "\ufffd" in sample and n == 7


def test_multi_turn_reads_system_and_last_user_turns():
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "FIRST user turn"},
        {"role": "assistant", "content": "ASSISTANT reply"},
        {"role": "user", "content": "SECOND user turn"},
        {"role": "assistant", "content": "another reply"},
        {"role": "user", "content": "THIRD user turn"},
    ]
    sample, _ = F.request_text(messages)
    assert "helpful assistant" in sample
    assert "SECOND" in sample and "THIRD" in sample
    assert "FIRST" not in sample and "ASSISTANT" not in sample
    assert sample.index("SECOND") < sample.index("THIRD")


def test_content_parts_and_objects():
    class Msg:
        role = "user"
        content = [{"type": "text", "text": "def f(x): return x"}, {"type": "image_url", "image_url": {}}]

    sample, _ = F.request_text([Msg()])
    assert "def f(x)" in sample


def test_malformed_messages_are_empty_not_errors():
    for bad in (None, 42, [None, 3, {"role": 5}], [{"content": None}], {"role": "user"}, object()):
        sample, n = F.request_text(bad)
        assert isinstance(sample, str) and sample.strip() == "" and n == 0, (bad, sample, n)


def test_long_input_is_read_head_and_tail():
    text = "HEAD " + "x" * 1_000_000 + " TAIL"
    sample, n = F.request_text([{"role": "user", "content": text}])
    assert n == len(text)
    assert len(sample) <= F.HEAD_CHARS + F.TAIL_CHARS + 1
    assert sample.startswith("HEAD") and sample.endswith("TAIL")


def test_dense_vector_shape_and_names():
    feats = F.extract("def f(x):\n    return x ** 2  # square\n")
    assert feats.dense.shape == (F.N_DENSE,) == (len(F.DENSE_NAMES),)
    assert np.all(np.isfinite(feats.dense))
    assert feats.buckets.dtype.kind == "i"
    assert feats.buckets.size and feats.buckets.min() >= 0 and feats.buckets.max() < F.N_BUCKETS


def _named(text: str) -> dict[str, float]:
    return dict(zip(F.DENSE_NAMES, F.extract(text).dense, strict=True))


def test_markers_fire_on_their_domain():
    code = _named("```python\nimport os\ndef main():\n    print(os.getcwd())\n```")
    math = _named("Compute $\\frac{3}{4} + \\sqrt{16}$ and find x if 2x + 3 = 11.")
    chat = _named("Write a poem about friendship and tell me why you think it matters.")
    assert code["count_fence"] > 0 and code["count_words_code_kw"] > 0 and code["count_indent"] > 0
    assert math["count_latex_cmd"] > 0 and math["count_latex_struct"] > 0 and math["count_eq_digit"] > 0
    assert chat["count_words_chat_words"] > 0 and chat["count_words_pronouns"] > 0
    assert chat["count_fence"] == 0 and chat["count_latex_cmd"] == 0


def test_entropy_features():
    flat = _named("aaaaaaaaaaaaaaaa")
    varied = _named("The quick brown fox jumps over the lazy dog 0123456789!")
    assert flat["byte_entropy"] == 0.0
    assert 0.0 < varied["byte_entropy"] <= 1.0
    unicode = _named("日本語のテキストと English text ✓")
    assert unicode["char_entropy"] > 0 and unicode["share_non_ascii"] > 0


def test_empty_and_whitespace():
    for text in ("", "   \n\t  "):
        feats = F.extract(text)
        assert feats.buckets.size == 0 and np.all(np.isfinite(feats.dense))


def test_hashing_is_deterministic_and_stable():
    # bucket ids are part of the artifact contract: a change here must bump FEATURE_VERSION
    a = F.extract("Write a function to add two numbers.").buckets
    b = F.extract("Write a function to add two numbers.").buckets
    assert np.array_equal(a, b)
    assert F.extract("abc").buckets.tolist() == STABLE_ABC


def test_case_and_digits_fold():
    assert np.array_equal(F.extract("Price 123").buckets, F.extract("price 456").buckets)


STABLE_ABC = [77660, 80046, 41654, 81945, 48193, 106017, 72995, 6309]


def test_scripts_without_spaces_have_one_word_per_character():
    # 共 3 个 苹 果: a CJK character is a word, and so is the number right after one
    named = _named("共3个苹果")
    assert np.isclose(named["log_words"], np.log1p(5))
    assert np.isclose(named["count_numbers"], np.log1p(1))
    # one "word" per character also for kana and Hangul syllables; Vietnamese letters stay joined
    assert np.isclose(_named("りんご")["log_words"], np.log1p(3))
    assert np.isclose(_named("người Việt")["log_words"], np.log1p(2))


def test_every_script_is_lower_cased():
    assert np.array_equal(np.sort(F.extract("КАК ДЕЛА").buckets), np.sort(F.extract("как дела").buckets))
    assert np.array_equal(np.sort(F.extract("ÉCOLE").buckets), np.sort(F.extract("école").buckets))


def test_non_ascii_marks_fold_to_ascii():
    times = _named("12 × 7")
    assert times["count_eq_digit"] > 0  # × is an operator: 12*7
    assert _named("١٢ + ٣")["count_numbers"] > 0  # Arabic-Indic digits are digits
    arabic = _named("ما هو اسمك؟")
    assert arabic["share_question"] > 0  # the Arabic question mark is a question mark
    chinese = _named("你叫什么名字？")
    assert chinese["share_question"] > 0
    # ¿ does not glue to the next word: "¿cómo" is the word "cómo", a question word
    assert _named("¿Cómo estás?")["count_words_question"] > 0


def test_multilingual_markers_count_towards_the_same_groups():
    for text in ("Wie viele Äpfel hat Anna insgesamt?", "Сколько яблок купила Маша?", "她一共有多少个苹果？"):
        assert _named(text)["count_words_math_words"] + _named(text)["count_words_math_phrases"] > 0, text
    for text in (
        "Как отсортировать список словарей?",
        "¿Cómo ordenar una lista en Python?",
        "编写代码返回列表",
    ):
        assert _named(text)["count_words_code_topic"] > 0, text
    for text in ("Écris un poème sur la mer.", "Schreibe ein Gedicht über das Meer.", "写一首关于大海的诗歌"):
        assert _named(text)["count_words_chat_words"] + _named(text)["count_words_chat_request"] > 0, text


def test_lexicon_phrases_are_one_to_three_words():
    from classifier.features import lexicon as LX

    for name in LX.MARKER_GROUPS:
        for phrase in LX.group_phrases(name):
            assert 1 <= len(LX._keys_of(phrase)) <= 2, (name, phrase)
