"""Request context buckets, key format and back-off levels (specroute/contracts/context.py)."""

from __future__ import annotations

import timeit

import pytest

from specroute.contracts.context import (
    GLOBAL_LEVEL,
    JSON_CONSTRAINT,
    TOOLS_CONSTRAINT,
    RequestContext,
    context_keys_for,
    length_bucket,
    level_keys,
    parse_context,
    request_context,
    script_of,
    script_of_texts,
    temperature_bucket,
)


@pytest.mark.parametrize(("text", "script"), [
    ("Write a Python function that sums a list.", "latin"),
    ("Écris une fonction qui additionne une liste, s'il te plaît.", "latin"),
    ("求解方程 x^2 + 3x + 2 = 0 的所有实数根。", "cjk"),
    ("次の方程式を解いてください: x + 2 = 5", "cjk"),
    ("다음 방정식을 푸세요", "cjk"),
    ("Решите уравнение x + 2 = 5 и объясните решение.", "cyrillic"),
    ("حل المعادلة التالية من فضلك", "arabic"),
    ("Λύστε την εξίσωση παρακαλώ", "other"),
    ("समीकरण हल करें", "other"),
    ("", "latin"),
    ("1234 + 5678 = ?", "latin"),
    ("∑∫ 12 → 34", "latin"),  # no letters at all
])
def test_script_buckets(text: str, script: str) -> None:
    assert script_of(text) == script


def test_cjk_outweighs_latex_and_the_question_decides() -> None:
    # a Chinese question full of LaTeX commands is still CJK (a CJK character carries about a word)
    assert script_of(r"计算积分 \int_0^1 \frac{x}{\sqrt{1+x}} dx 的值") == "cjk"
    # the last non-empty text (the question) decides, not the system prompt
    assert script_of_texts(["You are a helpful assistant.", "Решите уравнение", ""]) == "cyrillic"
    assert script_of_texts([]) == "latin"


def test_temperature_and_length_buckets() -> None:
    assert [temperature_bucket(t) for t in (0.0, 0.0005, 0.2, 0.8, 0.81, 1.0, 2.0)] == \
        ["0", "0", "low", "low", "high", "high", "high"]
    assert temperature_bucket(None) == "high"  # the OpenAI default is 1
    assert [length_bucket(n) for n in (0, 1023, 1024, 8191, 8192, 10**6)] == \
        ["short", "short", "medium", "medium", "long", "long"]


def test_key_round_trip_and_levels() -> None:
    ctx = request_context(["Решите уравнение x + 2 = 5"], 0.0, 40).with_domain("math")
    assert ctx == RequestContext("math", "cyrillic", "0", "short")
    assert ctx.key == "d=math|s=cyrillic|t=0|l=short" and ctx.coarse_key == "d=math|t=0"
    assert parse_context(ctx.key) == ctx
    assert RequestContext().key == "" and RequestContext().coarse_key == ""
    assert level_keys("math", ctx) == (ctx.key, "d=math|t=0", "math", GLOBAL_LEVEL)
    assert level_keys("math", None) == ("math", GLOBAL_LEVEL)
    assert level_keys("code", ctx) == ("code", GLOBAL_LEVEL)  # a context of another domain is not used


@pytest.mark.parametrize("bad", [
    "", "d=code", "d=code|s=latin|t=0", "d=code|s=latin|t=0|l=short|x=1", "s=latin|d=code|t=0|l=short",
    "d=code|s=klingon|t=0|l=short", "d=code|s=latin|t=0.5|l=short", "d=code|s=latin|t=0|l=huge",
    "d=co:de|s=latin|t=0|l=short", "d=|s=latin|t=0|l=short", "d=" + "x" * 100 + "|s=latin|t=0|l=short",
    "d=code|s=latin|t=0|lshort", "d=code|s=latin|t=0|l=short|c=xml", "d=code|s=latin|t=0|l=short|c=json|x=1",
    "d=code|s=latin|t=0|c=json|l=short",
])
def test_malformed_context_keys_are_rejected(bad: str) -> None:
    assert parse_context(bad) is None
    assert context_keys_for(bad, "code") == ()


def test_the_constraint_is_its_own_dimension_and_old_keys_read_unconstrained() -> None:
    plain = request_context(["Give me the user as JSON"], 0.0, 40).with_domain("code")
    js = request_context(["Give me the user as JSON"], 0.0, 40, JSON_CONSTRAINT).with_domain("code")
    tools = RequestContext("code", "latin", "0", "short", TOOLS_CONSTRAINT)
    # unconstrained: the key of every context from before the dimension existed (its statistics read on)
    assert plain.constraint == "none" and plain.key == "d=code|s=latin|t=0|l=short"
    assert (js.key, js.coarse_key) == ("d=code|s=latin|t=0|l=short|c=json", "d=code|t=0|c=json")
    assert tools.coarse_key == "d=code|t=0|c=tools" and js.with_domain("math").constraint == "json"
    assert level_keys("code", js) == (js.key, "d=code|t=0|c=json", "code", GLOBAL_LEVEL)
    for ctx in (plain, js, tools):
        assert parse_context(ctx.key) == ctx
    assert parse_context("d=code|s=latin|t=0|l=short|c=none") == plain   # an explicit `none` reads the same
    assert context_keys_for(js.key, "code") == (js.key, "d=code|t=0|c=json")
    assert request_context(["x"], 0.0, 1, "grammar").constraint == "none"   # not a bucket: none
    # the longest valid key fits the bound a record's context is checked against
    longest = RequestContext("x" * 64, "cyrillic", "high", "medium", TOOLS_CONSTRAINT).key
    assert parse_context(longest) is not None


def test_context_keys_for_a_record() -> None:
    key = "d=code|s=latin|t=high|l=long"
    assert context_keys_for(key, "code") == (key, "d=code|t=high")
    assert context_keys_for(key, "math") == ()  # the record's domain must match its context


def test_context_is_cheap() -> None:
    english = ["You are helpful.", "Write a Python function that returns the sum of a list. " * 20]
    chinese = ["求解方程 x^2 + 3x + 2 = 0 的所有实数根，并给出详细步骤。" * 30]
    for texts in (english, chinese):
        n = 2000
        per_call = timeit.timeit(lambda t=texts: request_context(t, 0.7, 1200).with_domain("code").key,
                                 number=n) / n
        assert per_call < 100e-6, per_call  # a few microseconds; generous for a loaded CI core
