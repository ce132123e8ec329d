"""Cheap features of one request for the acceptance predictor (router/routing/predictor.py). Pure: no
I/O, no tokenizer, no model; a few C-level passes over at most `SAMPLE_CHARS` characters of the prompt.

Two parts, joined into one vector in `FEATURES` order:

- prompt features (`prompt_features`, computed at admit from the prompt texts and the temperature):
  size, code fences and code punctuation, requested-format words (JSON, table, list, ...), cues that
  the answer copies the prompt (quoted or fenced text, "rewrite / fix / translate / convert ..."),
  cues of a short or a long answer, the share of non-ASCII characters (the language) and of digits,
  and the temperature;
- classifier features (`classifier_features`, computed by the decision from the classifier's
  probabilities and uncertainty): the top domain as one-hot, the margin between the top two
  probabilities and the uncertainty.

Every feature lies in [0, 1] (sizes on a log scale), so one ridge penalty suits them all. The vector
is versioned (`FEATURE_VERSION`): a predictor trained on another version's vector is not used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence

FEATURE_VERSION = 1
SAMPLE_CHARS = 4096   # of the last prompt text, for the cue counts (size counts every text)

PROMPT_FEATURES: tuple[str, ...] = (
    "log_chars",        # log(1 + prompt characters) / 12, capped at 1
    "log_lines",        # log(1 + prompt lines) / 6
    "code_fence",       # the prompt holds a ``` fence
    "code_punct",       # share of code punctuation ({}();=<>[]) among the characters, x 10, capped at 1
    "format_words",     # asks for a format: json, table, list, markdown, yaml, csv, bullet (one each, capped at 3) / 3
    "copy_cues",        # rewrite, fix, translate, convert, refactor, correct, edit, ... (capped at 3) / 3
    "quoted_share",     # share of the characters inside quotes or a fence
    "short_cues",       # briefly, one word, one sentence, concise, only the answer, ...
    "long_cues",        # explain, detailed, step by step, essay, story, ...
    "non_ascii",        # share of non-ASCII characters
    "digits",           # share of digits, x 5, capped at 1
    "greedy",           # temperature below 1e-3
    "temperature",      # temperature / 2, capped at 1 (an absent one is OpenAI's 1)
)
DOMAIN_FEATURES: tuple[str, ...] = ("domain_chat", "domain_code", "domain_math")
CLASSIFIER_FEATURES: tuple[str, ...] = (*DOMAIN_FEATURES, "margin", "uncertainty")
FEATURES: tuple[str, ...] = (*PROMPT_FEATURES, *CLASSIFIER_FEATURES)


class _Cue:
    """Cue words that start at a word boundary, case-insensitive: the matches of `\\b` + `body` with
    IGNORECASE, found in the lower-cased text by `body` alone (which lets the regex engine skip to its
    possible first characters instead of trying every position); a candidate counts only where a word
    starts, and the search resumes one character later where it does not."""

    __slots__ = ("rx",)

    def __init__(self, body: str) -> None:
        self.rx = re.compile(body)

    def _matches(self, lowered: str) -> Iterator[re.Match[str]]:
        pos, search = 0, self.rx.search
        while (m := search(lowered, pos)) is not None:
            if _BOUNDARY.match(lowered, m.start()):
                yield m
                pos = m.end()
            else:
                pos = m.start() + 1

    def count(self, lowered: str) -> int:
        return sum(1 for _ in self._matches(lowered))

    def found(self, lowered: str) -> bool:
        return next(self._matches(lowered), None) is not None


_BOUNDARY = re.compile(r"\b")
_FORMAT = _Cue(r"(json|table|list|markdown|yaml|csv|bullet|xml|html)s?\b")
_COPY = _Cue(r"(rewrite|rephrase|paraphrase|fix|correct|translate|convert|refactor|edit|modify|"
             r"proofread|reformat|format|improve|complete|continue|repeat|copy)\w*")
_SHORT = _Cue(r"(brief\w*|concise\w*|one (word|sentence|line)|short\w*|only the answer|just the answer|"
              r"yes or no|in \d+ words)\b")
_LONG = _Cue(r"(explain\w*|detail\w*|step[- ]by[- ]step|essay|story|elaborate|describe|discuss|"
             r"comprehensive|in depth)\b")
_QUOTED = re.compile(r"```.*?(```|$)|\"[^\"\n]{8,}\"|“[^”\n]{8,}”|`[^`\n]{8,}`", re.DOTALL)
_PUNCT = str.maketrans("", "", "{}();=<>[]")
_ASCII_DIGITS = str.maketrans("", "", "0123456789")


def _digits(text: str) -> int:
    """How many characters of `text` are digits (`str.isdigit`): ASCII text in one C-level pass."""
    if text.isascii():
        return len(text) - len(text.translate(_ASCII_DIGITS))
    return sum(c.isdigit() for c in text)


def _cap(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


def prompt_features(texts: Sequence[str], temperature: float | None) -> tuple[float, ...]:
    """The prompt part of the vector (`PROMPT_FEATURES` order): cues from the last non-empty text (its
    first `SAMPLE_CHARS` characters), size over every text."""
    chars = sum(len(t) for t in texts)
    lines = sum(t.count("\n") + 1 for t in texts if t)
    last = next((t for t in reversed(texts) if t.strip()), "")[:SAMPLE_CHARS]
    n = max(len(last), 1)
    punct = len(last) - len(last.translate(_PUNCT))
    quoted = sum(m.end() - m.start() for m in _QUOTED.finditer(last))
    ascii_chars = len(last.encode("ascii", "ignore"))
    digits = _digits(last)
    lowered = last.lower()
    temp = 1.0 if temperature is None else float(temperature)
    return (
        _cap(math.log1p(chars) / 12.0),
        _cap(math.log1p(lines) / 6.0),
        1.0 if "```" in last else 0.0,
        _cap(10.0 * punct / n),
        min(_FORMAT.count(lowered), 3) / 3.0,
        min(_COPY.count(lowered), 3) / 3.0,
        _cap(quoted / n),
        1.0 if _SHORT.found(lowered) else 0.0,
        1.0 if _LONG.found(lowered) else 0.0,
        _cap(1.0 - ascii_chars / n) if last else 0.0,
        _cap(5.0 * digits / n),
        1.0 if temp < 1e-3 else 0.0,
        _cap(temp / 2.0),
    )


def classifier_features(probabilities: Mapping[str, float], uncertainty: float) -> tuple[float, ...]:
    """The classifier part of the vector (`CLASSIFIER_FEATURES` order)."""
    ps = sorted(probabilities.values(), reverse=True)
    top = max(probabilities, key=lambda d: probabilities[d]) if probabilities else ""
    margin = (ps[0] - (ps[1] if len(ps) > 1 else 0.0)) if ps else 0.0
    return (*(1.0 if f"domain_{top}" == name else 0.0 for name in DOMAIN_FEATURES),
            _cap(margin), _cap(float(uncertainty)))


def request_features(prompt: Sequence[float], probabilities: Mapping[str, float],
                     uncertainty: float) -> tuple[float, ...]:
    """The whole vector (`FEATURES` order): the prompt part computed at admit, then the classifier's;
    empty when the prompt part is missing or of another length."""
    if len(prompt) != len(PROMPT_FEATURES):
        return ()
    return (*prompt, *classifier_features(probabilities, uncertainty))
