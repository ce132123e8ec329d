"""Cheap text features for the request classifier.

Everything here is pure and deterministic, and costs a bounded amount of work per request:

* `request_text(messages)` picks the text to read (system prompt + the last user turns; a plain
  string for completions) and keeps only the head and tail of long inputs, so a 100 KB prompt costs
  about as much as a 4 KB one.
* `dense_features(sample, full_len)` returns a small vector of statistics (byte/character entropy,
  shares of digits, operators, brackets, indentation and line structure, code / math / chat markers,
  length statistics).
* `ngram_hashes(sample)` returns the hashed character 3/4/5-gram bucket ids of the lower-cased sample
  (digits folded to `0`, whitespace runs folded to one space); a linear model scores them with one
  gather, `W[hashes].sum(0) / sqrt(len(hashes))`, which is the same as a dot product with the
  count vector divided by sqrt(N) (close to an L2 normalisation: most n-grams occur once).

All the per-character work is done by C code (bytes.translate, numpy, re), never by Python loops.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

FEATURE_VERSION = 1
HEAD_CHARS = 2048  # characters read from the start of a long input
TAIL_CHARS = 2048  # ... and from its end
PART_CHARS = HEAD_CHARS + TAIL_CHARS
USER_TURNS = 2  # how many of the last user turns are read in a multi-turn request
NGRAM_ORDERS = (3, 4, 5)
HASH_BITS = 18
N_BUCKETS = 1 << HASH_BITS

# ---------------------------------------------------------------------------------------------
# Request text


def _content_text(content: Any) -> str:
    """Text of one message `content`: a string, bytes, or OpenAI-style content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content).decode("utf-8", errors="replace")
    if isinstance(content, Mapping):
        text = content.get("text")
        return text if isinstance(text, str) else ""
    if isinstance(content, Sequence):
        return "\n".join(_content_text(part) for part in content[:64] if not isinstance(part, str | bytes))
    return ""


def _head_tail(text: str, head: int = HEAD_CHARS, tail: int = TAIL_CHARS) -> str:
    if len(text) <= head + tail:
        return text
    return text[:head] + "\n" + text[-tail:]


def _role_and_content(message: Any) -> tuple[str, Any]:
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    elif isinstance(message, str | bytes):
        role, content = "user", message
    else:  # pydantic models or other objects with attributes
        role, content = getattr(message, "role", None), getattr(message, "content", None)
    return (role if isinstance(role, str) else "user"), content


def request_text(messages: Any) -> tuple[str, int]:
    """(sample, full_length): the text the classifier reads and the length of what it stands for.

    `messages` is a list of `{"role", "content"}` messages (dicts or objects), or a plain string /
    bytes for completions. The system prompt and the last `USER_TURNS` user turns are read; each part
    and the joined result keep only their head and tail. Anything malformed counts as no text.
    """
    if isinstance(messages, str):
        return _head_tail(messages), len(messages)
    if isinstance(messages, bytes | bytearray | memoryview):
        raw = bytes(messages)
        if len(raw) > 4 * PART_CHARS:  # bound the decode cost too
            raw = raw[: 4 * HEAD_CHARS] + b"\n" + raw[-4 * TAIL_CHARS :]
        return _head_tail(raw.decode("utf-8", errors="replace")), len(messages)
    if not isinstance(messages, Iterable) or isinstance(messages, Mapping):
        if isinstance(messages, Mapping):
            messages = [messages]
        else:
            return "", 0
    try:
        items = list(messages)
    except Exception:  # a broken iterable is treated as empty input
        return "", 0
    system: list[str] = []
    users: list[str] = []
    total = 0
    for message in items:
        role, content = _role_and_content(message)
        if role in ("system", "developer"):
            text = _content_text(content)
            system.append(_head_tail(text, HEAD_CHARS // 2, TAIL_CHARS // 2))
            total += len(text)
    n_users = 0
    for message in reversed(items):
        role, content = _role_and_content(message)
        if role in ("system", "developer", "assistant", "tool", "function"):
            continue
        text = _content_text(content)
        users.append(_head_tail(text))
        total += len(text)
        n_users += 1
        if n_users >= USER_TURNS:
            break
    users.reverse()
    return _head_tail("\n".join(system + users)), total


# ---------------------------------------------------------------------------------------------
# Hashing primitives (uint32 arithmetic, wraps mod 2**32; deterministic across processes)

_U32 = np.uint32
_FINAL = _U32(0x2545F491)
_SHIFT = _U32(32 - HASH_BITS)
_NGRAM_MULTS = [_U32(m) for m in (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1)]
_BIGRAM_MULT = _U32(0x7FEB352D)
_SALTS = {
    "char3": _U32(0x1B873593),
    "char4": _U32(0xCC9E2D51),
    "char5": _U32(0xE6546B64),
    "word": _U32(0x3C6EF372),
    "bigram": _U32(0xA54FF53A),
    "first": _U32(0x510E527F),
}
_MARKER_TABLE_BITS = 20
_MARKER_SHIFT = _U32(32 - _MARKER_TABLE_BITS)
_MARKER_SALT = _U32(0x5BE0CD19)

_WORD_BYTES = np.zeros(256, dtype=np.int8)
_WORD_BYTES[list(b"abcdefghijklmnopqrstuvwxyz0_")] = 1
_WORD_BYTES[128:] = 1
_rng = np.random.default_rng(0x5EC7)
# Per-byte and per-byte-pair random tables; non-word bytes contribute 0, so a word's hash is the sum
# of its bytes' and adjacent byte pairs' entries (order-sensitive through the pairs).
_T1 = _rng.integers(1, 2**32, size=256, dtype=np.uint64).astype(np.uint32)
_T1[_WORD_BYTES == 0] = 0
_T2 = _rng.integers(1, 2**32, size=(256, 256), dtype=np.uint64).astype(np.uint32)
_T2[_WORD_BYTES == 0, :] = 0
_T2[:, _WORD_BYTES == 0] = 0
_T2 = _T2.ravel()
del _rng



def _bucket(h: np.ndarray, salt: np.uint32) -> np.ndarray:
    return (((h ^ salt) * _FINAL) >> _SHIFT).astype(np.intp)


# A-Z -> a-z and 0-9 -> 0, everything else unchanged (same length, whitespace kept).
_LOWER_FOLD = bytes.maketrans(bytes(range(65, 91)) + b"0123456789", bytes(range(97, 123)) + b"0000000000")


def _fold_ws(folded: bytes) -> bytes:
    return b" " + b" ".join(folded.split()) + b" "


def normalise(sample: str) -> bytes:
    """UTF-8, ASCII lower-cased, digits folded to `0`, whitespace runs folded to one space, padded."""
    return _fold_ws(sample.encode("utf-8", errors="surrogatepass").translate(_LOWER_FOLD))


def _word_hashes(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes uint32, start offsets) of the words in a normalised byte array (starts with a space)."""
    w = _WORD_BYTES.take(arr)
    starts = np.flatnonzero(w[1:] > w[:-1]) + 1
    if starts.size == 0:
        return np.zeros(0, dtype=np.uint32), starts
    a32 = arr.astype(np.intp)
    contrib = _T1.take(a32)
    contrib[:-1] += _T2.take(a32[:-1] * 256 + a32[1:])
    return np.add.reduceat(contrib, starts).astype(np.uint32), starts


def _bigram_keys(words: np.ndarray) -> np.ndarray:
    return words[:-1] * _BIGRAM_MULT + words[1:]


def _keys_of(phrase: str) -> np.uint32:
    """The word (one word) or bigram (two words) key of a phrase, as the sample path computes it."""
    arr = np.frombuffer(normalise(phrase), dtype=np.uint8)
    words, _ = _word_hashes(arr)
    if words.size == 1:
        return words[0]
    if words.size == 2:
        return _bigram_keys(words)[0]
    raise ValueError(f"marker phrase must have one or two words: {phrase!r}")


# Word / bigram marker groups (pooled evidence that generalises across sources).
_WORD_GROUPS: dict[str, str] = {
    "code_kw": "def elif lambda self none nullptr null println printf cout console std void const var let "
    "fn impl pub mut struct enum namespace include import return async await yield typedef static public "
    "private protected boolean bool int str dict len range args kwargs true false endif foreach sudo npm "
    "pip git select insert class try except catch throw raise assert func package",
    "code_topic": "python python0 javascript typescript java golang rust ruby php kotlin swift scala haskell "
    "perl bash shell powershell sql mysql postgresql html css json xml yaml regex api apis code coding "
    "script program programming function functions method methods class classes variable variables array "
    "arrays list lists string strings tuple tuples dictionary dictionaries integer integers boolean "
    "algorithm implement implementation compile compiler debug bug error exception library framework module "
    "django flask react vue node pandas numpy docker kubernetes linux database query server client input "
    "output returns parameter parameters argument arguments recursion recursive loop iterate sort sorted "
    "substring char characters index element elements matrix node tree binary unicode ascii lowercase "
    "uppercase camel snake file files vue tailwind tensorflow pytorch keras laravel ubuntu nginx apache github "
    "gitlab npm yarn webpack terminal commandline cli frontend backend deploy deployment container containers "
    "aws azure gcp excel vba matlab jupyter notebook repo repository commit branch endpoint http https url dom "
    "jquery bootstrap android ios app website browser js ts cpp monad runtime syntax sdk ide vscode vim emacs "
    "cmd windows macos ssh tcp udp socket sockets thread threads asynchronous concurrency mutex gpu cuda shader "
    "unity unreal godot pygame selenium scraping scrape crawler csv xlsx pdf parse parser parsing serialize "
    "toml config configuration install installed package packages dependency dependencies debugging stack "
    "traceback segfault pointer crash crashes backend frontend component components widget button dataframe "
    "model training dataset neural transformer llm prompt token tokens spreadsheet formula macro",
    "math_words": "total sum product difference probability remainder prime divisible divisor equation equations "
    "solve compute calculate evaluate simplify find area perimeter radius diameter triangle angle square "
    "circle ratio average mean profit cost costs speed rate each per times left remaining altogether "
    "greatest least smallest largest positive negative real digits number numbers expression polynomial "
    "fraction sequence series coefficient root roots graph units unit cm meters km hours minutes seconds "
    "dollars cents price sold bought pay paid earns spent buys miles",
    "number_words": "one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty forty "
    "fifty hundred thousand million half twice thrice triple double third quarter dozen percent",
    "chat_words": "essay poem story stories letter email blog article song joke explain describe discuss opinion "
    "advice tips summarize summary rewrite translate paragraph tone persuasive imagine pretend roleplay "
    "character history culture why who should would could believe best happens people country world life "
    "health movie book music travel food feel think please thanks famous true really",
    "pronouns": "i me my you your we our us they their he she his her",
    "stopwords": "the a an of and to in is that it for on with as at by this be or are was",
    "question": "what why how who where when which whom whose",
    "single_var": "x y z n k m p q f g",
}
_BIGRAM_GROUPS: dict[str, list[str]] = {
    "code_request": [
        "a function", "python function", "a program", "a script", "the code", "this code", "write code",
        "a class", "a method", "sql query", "a query", "a regex", "the function", "function that",
        "function to", "function which", "python script", "python program", "code to", "code for",
        "code that", "in python", "in javascript", "in java", "in rust", "in c", "using python",
        "python code", "an api", "a bash", "unit tests", "following code",
    ],
    "math_phrases": [
        "how many", "how much", "value of", "more than", "less than", "answer choices", "sum of",
        "product of", "remainder when", "probability that", "number of", "what percent", "per hour",
        "each day", "in total", "the total", "the area", "the perimeter", "the value", "the sum",
        "the number", "how long", "how far", "how old", "find the", "compute the", "solve for",
    ],
    "chat_request": [
        "a poem", "an essay", "a story", "a letter", "an email", "a blog", "a song", "a speech",
        "a haiku", "a limerick", "a tweet", "a summary", "the style", "your answer", "your response",
        "the following", "at least", "do not", "in english", "a list", "your own", "in the",
    ],
}


def _build_marker_table() -> tuple[np.ndarray, list[str]]:
    names = list(_WORD_GROUPS) + list(_BIGRAM_GROUPS)
    table = np.zeros(1 << _MARKER_TABLE_BITS, dtype=np.uint16)
    for bit, name in enumerate(names):
        phrases = _WORD_GROUPS[name].split() if name in _WORD_GROUPS else _BIGRAM_GROUPS[name]
        for phrase in phrases:
            key = np.array([_keys_of(phrase)], dtype=np.uint32)
            slot = int(((key ^ _MARKER_SALT) * _FINAL >> _MARKER_SHIFT)[0])
            table[slot] |= np.uint16(1 << bit)
    return table, names


_MARKER_TABLE, _MARKER_GROUPS = _build_marker_table()
_MARKER_BITS = np.array([1 << i for i in range(len(_MARKER_GROUPS))], dtype=np.uint16)

# ---------------------------------------------------------------------------------------------
# Dense features

_CLASS_CHARS: dict[str, bytes] = {
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
_CLASS_NAMES = [*_CLASS_CHARS, "non_ascii", "control"]
_CLASS_MATRIX = np.zeros((256, len(_CLASS_NAMES)), dtype=np.float64)
for _j, _chars in enumerate(_CLASS_CHARS.values()):
    _CLASS_MATRIX[list(_chars), _j] = 1.0
_CLASS_MATRIX[128:, len(_CLASS_CHARS)] = 1.0
_CONTROL_BYTES = [c for c in range(32) if c not in (9, 10, 13)] + [127]
_CLASS_MATRIX[_CONTROL_BYTES, len(_CLASS_CHARS) + 1] = 1.0

_IS_DIGIT = np.zeros(256, dtype=bool)
_IS_DIGIT[ord("0")] = True  # after folding
_IS_OP = np.zeros(256, dtype=bool)
_IS_OP[list(b"+-*/=<>^")] = True
_IS_ALNUM = np.zeros(256, dtype=bool)
_IS_ALNUM[list(b"abcdefghijklmnopqrstuvwxyz0")] = True
_IS_LOWER_ORIG = np.zeros(256, dtype=bool)
_IS_LOWER_ORIG[97:123] = True
_IS_UPPER_ORIG = np.zeros(256, dtype=bool)
_IS_UPPER_ORIG[65:91] = True

_LATEX_CMD_RE = re.compile(r"\\[a-zA-Z]{2,}")
_TAG_RE = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>\n]{0,80})?>")

# Two-byte patterns counted in one pass over the byte pairs of the lower-cased, digit-folded sample.
_PAIR_GROUPS: dict[str, tuple[bytes, ...]] = {
    "fence": (b"``", b"~~"),
    "code_ops": (b"==", b"!=", b"=>", b"->", b"::", b"+=", b"-=", b"&&", b"||", b"++", b"){", b"};",
                 b":=", b"<<", b">>", b"[]", b"()", b"{}", b"0]", b"[0"),
    "line_end_code": (b";\n", b"{\n", b"}\n", b":\n", b")\n", b",\n"),
    "indent": (b"\n ", b"\n\t"),
    "comment": (b"# ", b"//", b"/*", b"*/", b'""', b"''", b"#!", b"<!"),
    "latex_math": (b"\\(", b"\\[", b"$$", b"\\{", b"\\\\"),
    "latex_struct": (b"^{", b"_{", b"}{", b"^0", b"^(", b"^-"),
    "money_percent": (b"$0", b"0%"),
}
_PAIR_TABLE = np.zeros(1 << 16, dtype=np.intp)
for _g, _pairs in enumerate(_PAIR_GROUPS.values(), start=1):
    for _p in _pairs:
        _PAIR_TABLE[_p[0] * 256 + _p[1]] = _g
_N_PAIR_GROUPS = len(_PAIR_GROUPS) + 1
_STRUCT_NAMES = [
    *_PAIR_GROUPS, "tags", "latex_cmd", "eq_digit", "eq_var", "call_syntax", "dotted", "snake_case",
    "camel_case", "numbers", "dollar_pairs",
]
_COUNT_NAMES = _STRUCT_NAMES + [f"words_{g}" for g in _MARKER_GROUPS]

DENSE_NAMES: list[str] = [
    "log_len", "log_sample_len", "log_lines", "mean_line_len", "max_line_len", "blank_line_share",
    "log_words", "mean_word_len", "byte_entropy", "char_entropy", "char_entropy_norm",
    *[f"share_{name}" for name in _CLASS_NAMES],
    "junk_share",
    *[f"count_{name}" for name in _COUNT_NAMES],
    *[f"rate_{name}" for name in _COUNT_NAMES],
]
N_DENSE = len(DENSE_NAMES)
_N_BASE = 11 + len(_CLASS_NAMES) + 1


def _entropy_bits(counts: np.ndarray, total: int) -> float:
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


class Features:
    """Dense vector + hashed bucket ids of one request sample."""

    __slots__ = ("buckets", "dense", "junk")

    def __init__(self, dense: np.ndarray, buckets: np.ndarray, junk: float) -> None:
        self.dense = dense
        self.buckets = buckets
        self.junk = junk


def extract(sample: str, full_len: int | None = None) -> Features:
    """Features of a request sample (see `request_text`); `full_len` is the untruncated length."""
    if full_len is None:
        full_len = len(sample)
    dense = np.zeros(N_DENSE, dtype=np.float64)
    n_chars = len(sample)
    dense[0] = math.log1p(full_len)
    dense[1] = math.log1p(n_chars)
    if n_chars == 0 or sample.isspace():
        return Features(dense, np.zeros(0, dtype=np.intp), 0.0)

    raw = sample.encode("utf-8", errors="surrogatepass")
    n_bytes = len(raw)
    lines = sample.split("\n")
    n_lines = len(lines)
    dense[2] = math.log1p(n_lines)
    dense[3] = math.log1p(n_chars / n_lines)
    dense[4] = math.log1p(max(map(len, lines)))
    dense[5] = sample.count("\n\n") / n_lines

    arr = np.frombuffer(raw, dtype=np.uint8)
    counts = np.bincount(arr, minlength=256)
    byte_h = _entropy_bits(counts, n_bytes)
    dense[8] = byte_h / 8.0
    if n_bytes == n_chars:  # ASCII: characters are bytes
        char_h = byte_h
    else:
        cps = np.frombuffer(sample.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        _, ccounts = np.unique(cps, return_counts=True)
        char_h = _entropy_bits(ccounts, n_chars)
    dense[9] = char_h / 8.0
    dense[10] = char_h / math.log2(n_chars + 1)
    k = 11
    dense[k : k + len(_CLASS_NAMES)] = (counts @ _CLASS_MATRIX) / n_bytes
    k += len(_CLASS_NAMES)
    n_control = int(counts[_CONTROL_BYTES].sum())
    junk = junk_share(sample, n_control)
    dense[k] = junk

    # normalised bytes: words, bigrams, char n-grams
    folded = raw.translate(_LOWER_FOLD)
    norm = _fold_ws(folded)
    a = np.frombuffer(norm, dtype=np.uint8)
    words, starts = _word_hashes(a)
    n_words = words.size
    dense[6] = math.log1p(n_words)
    dense[7] = math.log1p(n_bytes / n_words) if n_words else 0.0

    # structural counts
    c = np.zeros(len(_COUNT_NAMES), dtype=np.float64)
    fa = np.frombuffer(folded, dtype=np.uint8).astype(np.intp)
    if fa.size >= 2:
        groups = _PAIR_TABLE.take(fa[:-1] * 256 + fa[1:])
        c[: _N_PAIR_GROUPS - 1] = np.bincount(groups, minlength=_N_PAIR_GROUPS)[1:]
    j = _N_PAIR_GROUPS - 1
    c[j] = len(_TAG_RE.findall(sample)) if "<" in sample else 0
    c[j + 1] = len(_LATEX_CMD_RE.findall(sample)) if "\\" in sample else 0
    dense_ops = np.frombuffer(norm.replace(b" ", b""), dtype=np.uint8)
    if dense_ops.size >= 3:
        d = _IS_DIGIT.take(dense_ops)
        o = _IS_OP.take(dense_ops)
        al = _IS_ALNUM.take(dense_ops)
        c[j + 2] = np.count_nonzero(d[:-2] & o[1:-1] & d[2:])
        c[j + 3] = np.count_nonzero(al[:-2] & (dense_ops[1:-1] == 61) & (d[2:] | (dense_ops[2:] == 40)))
    w_bytes = _WORD_BYTES.take(a).astype(bool)
    c[j + 4] = np.count_nonzero(w_bytes[:-1] & (a[1:] == 40))  # name(
    c[j + 5] = np.count_nonzero(w_bytes[:-2] & (a[1:-1] == 46) & w_bytes[2:])  # a.b
    c[j + 6] = np.count_nonzero(_IS_ALNUM.take(a[:-2]) & (a[1:-1] == 95) & _IS_ALNUM.take(a[2:]))  # a_b
    c[j + 7] = np.count_nonzero(_IS_LOWER_ORIG.take(arr[:-1]) & _IS_UPPER_ORIG.take(arr[1:]))  # aB
    c[j + 8] = np.count_nonzero(a.take(starts) == 48) if n_words else 0  # words starting with a digit
    c[j + 9] = counts[36] // 2
    j = len(_STRUCT_NAMES)

    # word markers
    bigrams = _bigram_keys(words) if n_words > 1 else np.zeros(0, dtype=np.uint32)
    keys = np.concatenate((words, bigrams))
    if keys.size:
        slots = ((keys ^ _MARKER_SALT) * _FINAL) >> _MARKER_SHIFT
        hits = _MARKER_TABLE.take(slots.astype(np.intp))
        hits = hits[hits != 0]
        if hits.size:
            c[j:] = ((hits[:, None] & _MARKER_BITS) != 0).sum(axis=0)
    n_counts = len(_COUNT_NAMES)
    k = _N_BASE
    dense[k : k + n_counts] = np.log1p(c)
    dense[k + n_counts : k + 2 * n_counts] = np.log1p(c * (1000.0 / (n_chars + 100.0)))

    # hashed buckets
    parts = []
    n = a.size
    a32 = a.astype(np.uint32)
    if n >= 3:
        h = a32[:-2] * _NGRAM_MULTS[0] + a32[1:-1] * _NGRAM_MULTS[1] + a32[2:] * _NGRAM_MULTS[2]
        parts.append(_bucket(h, _SALTS["char3"]))
        if n >= 4:
            h = h[:-1] + a32[3:] * _NGRAM_MULTS[3]
            parts.append(_bucket(h, _SALTS["char4"]))
            if n >= 5:
                h = h[:-1] + a32[4:] * _NGRAM_MULTS[4]
                parts.append(_bucket(h, _SALTS["char5"]))
    if n_words:
        parts.append(_bucket(words, _SALTS["word"]))
        parts.append(_bucket(words[:1], _SALTS["first"]))
        if n_words > 1:
            parts.append(_bucket(bigrams, _SALTS["bigram"]))
    buckets = np.concatenate(parts) if parts else np.zeros(0, dtype=np.intp)
    return Features(dense, buckets, junk)
