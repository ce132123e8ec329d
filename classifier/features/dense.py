"""The dense statistics: what each entry of the dense feature vector is (`DENSE_NAMES`).

Byte / character entropy, shares of character classes (`CLASS_CHARS`, per character: `non_ascii` is
the share of non-ASCII characters), line and word lengths (characters per word), counts and per-word
rates of structural byte patterns (`PAIR_GROUPS`, `STRUCT_NAMES`) and of the lexicon's marker groups.
Per character and per word rather than per byte, so that a statistic means the same in every script.
The fast path (`classifier.features.fast`) computes them through the tables of
`classifier.features.tables`; `tests/classifier/reference_features.py` computes them one by one.
"""

from __future__ import annotations

import re

import numpy as np

from classifier.features.lexicon import MARKER_GROUPS

CLASS_CHARS: dict[str, bytes] = {
    "digit": b"0123456789",
    "upper": bytes(range(65, 91)),
    "lower": bytes(range(97, 123)),
    "space": b" ",
    "newline": b"\n",
    "tab": b"\t",
    "operator": b"+-*/=<>^%|&~",
    "equals": b"=",
    "paren": b"()",
    "square": b"[]",
    "curly": b"{}",
    "sentence_punct": b".,!?",
    "question": b"?",
    "quote": b"'\"`",
    "colon_semicolon": b":;",
    "backslash": b"\\",
    "dollar": b"$",
    "underscore": b"_",
    "hash_at": b"#@",
}
CLASS_NAMES = [*CLASS_CHARS, "non_ascii", "control"]
N_CLASSES = len(CLASS_NAMES)
CLASS_MATRIX = np.zeros((256, N_CLASSES), dtype=np.float64)
for _j, _chars in enumerate(CLASS_CHARS.values()):
    CLASS_MATRIX[list(_chars), _j] = 1.0
CLASS_MATRIX[128:, len(CLASS_CHARS)] = 1.0
_CONTROL_BYTES = [c for c in range(32) if c not in (9, 10, 13)] + [127]
CLASS_MATRIX[_CONTROL_BYTES, len(CLASS_CHARS) + 1] = 1.0
# the fast path adds one column (ASCII letters and digits) to know whether the text has any

IS_DIGIT = np.zeros(256, dtype=bool)
IS_DIGIT[ord("0")] = True  # after folding
IS_OP = np.zeros(256, dtype=bool)
IS_OP[list(b"+-*/=<>^")] = True
IS_ALNUM = np.zeros(256, dtype=bool)
IS_ALNUM[list(b"abcdefghijklmnopqrstuvwxyz0")] = True
LATEX_CMD_RE = re.compile(r"\\[a-zA-Z]{2,}")
TAG_RE = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>\n]{0,80})?>")

# Two-byte patterns counted over the byte pairs of the lower-cased, digit-folded sample.
PAIR_GROUPS: dict[str, tuple[bytes, ...]] = {
    "fence": (b"``", b"~~"),
    "code_ops": (
        b"==",
        b"!=",
        b"=>",
        b"->",
        b"::",
        b"+=",
        b"-=",
        b"&&",
        b"||",
        b"++",
        b"){",
        b"};",
        b":=",
        b"<<",
        b">>",
        b"[]",
        b"()",
        b"{}",
        b"0]",
        b"[0",
    ),
    "line_end_code": (b";\n", b"{\n", b"}\n", b":\n", b")\n", b",\n"),
    "indent": (b"\n ", b"\n\t"),
    "comment": (b"# ", b"//", b"/*", b"*/", b'""', b"''", b"#!", b"<!"),
    "latex_math": (b"\\(", b"\\[", b"$$", b"\\{", b"\\\\"),
    "latex_struct": (b"^{", b"_{", b"}{", b"^0", b"^(", b"^-"),
    "money_percent": (b"$0", b"0%"),
}
PAIR_TABLE = np.zeros(1 << 16, dtype=np.intp)  # folded pair -> group (1-based), 0 = none
for _g, _pairs_of_group in enumerate(PAIR_GROUPS.values(), start=1):
    for _p in _pairs_of_group:
        PAIR_TABLE[_p[0] * 256 + _p[1]] = _g
N_PAIR_GROUPS = len(PAIR_GROUPS) + 1
STRUCT_NAMES = [
    *PAIR_GROUPS,
    "tags",
    "latex_cmd",
    "eq_digit",  # digit, operator, digit (whitespace removed): 0+0
    "eq_var",  # letter or digit, `=`, digit or `(` (whitespace removed): x=0
    "call_syntax",  # word byte then `(`: name(
    "dotted",  # word byte, `.`, word byte: a.b
    "snake_case",  # letter or digit, `_`, letter or digit: a_b
    "camel_case",  # lower-case then upper-case letter (raw text): aB
    "numbers",  # words that start with a digit
    "dollar_pairs",  # count of `$` // 2
]
COUNT_NAMES = STRUCT_NAMES + [f"words_{g}" for g in MARKER_GROUPS]
N_COUNTS = len(COUNT_NAMES)

DENSE_NAMES: list[str] = [
    "log_len",
    "log_sample_len",
    "log_lines",
    "mean_line_len",
    "max_line_len",
    "blank_line_share",
    "log_words",
    "mean_word_len",
    "byte_entropy",
    "char_entropy",
    "char_entropy_norm",
    *[f"share_{name}" for name in CLASS_NAMES],
    "junk_share",
    *[f"count_{name}" for name in COUNT_NAMES],
    *[f"rate_{name}" for name in COUNT_NAMES],
]
N_DENSE = len(DENSE_NAMES)
N_BASE = 11 + N_CLASSES + 1

# The order `scan` returns the dense vector in: the 11 scalar statistics and the junk share, the class
# shares, the counts, the rates. `dense[FAST_ORDER] = scan(...)[0]` gives the `DENSE_NAMES` order.
FAST_ORDER = np.array(
    [*range(11), N_BASE - 1, *range(11, 11 + N_CLASSES), *range(N_BASE, N_DENSE)], dtype=np.intp
)

# rates are counts per word, damped for short texts: count * RATE_WORDS / (n_words + RATE_WORDS) (a
# "word" of a script written without spaces is one character, see `hashing`)
RATE_WORDS = 20.0

N_CHAR_BINS = 4093
CHAR_BINS = np.uint32(N_CHAR_BINS)


def entropy_bits(counts: np.ndarray, total: int) -> float:
    nz = counts[counts > 0].astype(np.float64) / total
    return float(-(nz * np.log2(nz)).sum())


def junk_share(sample: str, n_control: int | None = None) -> float:
    """Share of characters that carry no text: control characters, U+FFFD, private use, surrogates."""
    if not sample:
        return 0.0
    if n_control is None:
        n_control = sum(1 for ch in sample if (ord(ch) < 32 and ch not in "\t\n\r") or ch == "\x7f")
    bad = n_control + sample.count("\ufffd")
    if not sample.isascii():
        bad += len(_JUNK_RE.findall(sample))
    return min(1.0, bad / len(sample))


_JUNK_RE = re.compile("[\ue000-\uf8ff\U000f0000-\U0010ffff\ud800-\udfff]")
