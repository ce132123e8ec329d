"""Cheap text features for the request classifier.

Everything here is pure and deterministic, and costs a bounded amount of work per request:

* `request_text(messages)` picks the text to read (system prompt + the last user turns; a plain
  string for completions) and keeps only the head and tail of long inputs, so a 100 KB prompt costs
  about as much as a 4 KB one.
* `extract(sample, full_len)` returns `Features`: a dense vector of statistics (`DENSE_NAMES`: byte /
  character entropy, shares of byte classes, line and word lengths, structural byte patterns, code /
  math / chat lexicon counts) and the hashed bucket ids of the character 3/4/5-grams, words, word
  bigrams and first word of the lower-cased, digit-folded, whitespace-folded sample.

Speed (the classifier runs on every request): `scan(sample, full_len)` computes all of it with a fixed
number of C-level passes (about 50 numpy calls whatever the length) and no Python loop over characters:

* one byte histogram gives the class shares (one matmul), the byte entropy (a `c*log2(c)` table), the
  control characters and which pattern families can occur at all;
* the byte *pairs* of the raw, the whitespace-folded and the whitespace-free text are read as uint16
  through a stride-1 view of the bytes (no copy) and looked up in 64K tables of pattern bits; a byte
  *triple* (`a.b`, `a_b`, `0+0`, `x=0`) is two adjacent pairs, `bits[i] << k | bits[i + 1]`;
* pattern counts are summed as packed 16-bit fields of uint64 table entries (one gather and one sum
  for four counts); the exclusive categories (raw pair groups, lexicon marker combinations) share one
  bincount and one small matmul;
* word hashes are one table lookup per byte pair (`T1[x] + T2[x, y]` pre-added) and one `reduceat`;
  the n-gram keys are written with `out=` into one preallocated uint32 array and finalised in place.
* non-ASCII text: the character entropy reuses the byte histogram for the ASCII characters and adds the
  (few) other code points in Python, or bins all code points when there are many.

`extract` returns the dense vector in `DENSE_NAMES` order (training and tests use it); `scan` returns
it in `FAST_ORDER` (the loaded classifier permutes its weights once, so scoring needs no reordering).
The reference formulation (one numpy expression per feature, the original implementation) lives in
`tests/classifier/reference_features.py`; the tests check that both give the same features.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

FEATURE_VERSION = 2
HEAD_CHARS = 1024  # characters read from the start of a long input
TAIL_CHARS = 1024  # ... and from its end
PART_CHARS = HEAD_CHARS + TAIL_CHARS
USER_TURNS = 2  # how many of the last user turns are read in a multi-turn request
NGRAM_ORDERS = (3, 4, 5)
HASH_BITS = 17
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
# Fast path: the contribution of byte i given the pair (x, y) = (byte i, byte i + 1) is T1[x] + T2[x, y]
# (the last byte of a normalised sample is a space, which contributes 0); indexed by the pair code
# x + 256 * y (see `_pairs`).
_T12 = (_T2.reshape(256, 256) + _T1[:, None]).T.ravel()

# A-Z -> a-z and 0-9 -> 0, everything else unchanged (same length, whitespace kept).
_LOWER_FOLD = bytes.maketrans(bytes(range(65, 91)) + b"0123456789", bytes(range(97, 123)) + b"0000000000")
_ASCII_WS = b" \t\n\r\x0b\x0c"  # what bytes.split() splits on


def _fold_ws(folded: bytes) -> bytes:
    return b" " + b" ".join(folded.split()) + b" "


def normalise(sample: str) -> bytes:
    """UTF-8, ASCII lower-cased, digits folded to `0`, whitespace runs folded to one space, padded."""
    return _fold_ws(sample.encode("utf-8", errors="surrogatepass").translate(_LOWER_FOLD))


def _pairs(buf: bytes) -> np.ndarray:
    """Pair codes `buf[i] + 256 * buf[i + 1]` for every i (len(buf) >= 2), as intp.

    A zero-copy little-endian uint16 view with stride 1 reads every byte pair; one cast makes the
    table index array.
    """
    return np.ndarray((len(buf) - 1,), dtype="<u2", buffer=buf, strides=(1,)).astype(np.intp)


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
        "a function",
        "python function",
        "a program",
        "a script",
        "the code",
        "this code",
        "write code",
        "a class",
        "a method",
        "sql query",
        "a query",
        "a regex",
        "the function",
        "function that",
        "function to",
        "function which",
        "python script",
        "python program",
        "code to",
        "code for",
        "code that",
        "in python",
        "in javascript",
        "in java",
        "in rust",
        "in c",
        "using python",
        "python code",
        "an api",
        "a bash",
        "unit tests",
        "following code",
    ],
    "math_phrases": [
        "how many",
        "how much",
        "value of",
        "more than",
        "less than",
        "answer choices",
        "sum of",
        "product of",
        "remainder when",
        "probability that",
        "number of",
        "what percent",
        "per hour",
        "each day",
        "in total",
        "the total",
        "the area",
        "the perimeter",
        "the value",
        "the sum",
        "the number",
        "how long",
        "how far",
        "how old",
        "find the",
        "compute the",
        "solve for",
    ],
    "chat_request": [
        "a poem",
        "an essay",
        "a story",
        "a letter",
        "an email",
        "a blog",
        "a song",
        "a speech",
        "a haiku",
        "a limerick",
        "a tweet",
        "a summary",
        "the style",
        "your answer",
        "your response",
        "the following",
        "at least",
        "do not",
        "in english",
        "a list",
        "your own",
        "in the",
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


# `_MARKER_TABLE[slot]`: bit g set if a phrase of marker group g hashes to the slot.
_MARKER_TABLE, _MARKER_GROUPS = _build_marker_table()

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
_N_CLASSES = len(_CLASS_NAMES)
_CLASS_MATRIX = np.zeros((256, _N_CLASSES), dtype=np.float64)
for _j, _chars in enumerate(_CLASS_CHARS.values()):
    _CLASS_MATRIX[list(_chars), _j] = 1.0
_CLASS_MATRIX[128:, len(_CLASS_CHARS)] = 1.0
_CONTROL_BYTES = [c for c in range(32) if c not in (9, 10, 13)] + [127]
_CLASS_MATRIX[_CONTROL_BYTES, len(_CLASS_CHARS) + 1] = 1.0
# the fast path adds one column (ASCII letters and digits) to know whether the text has any
_CLASS_MATRIX_X = np.hstack([_CLASS_MATRIX, np.zeros((256, 1))])
_CLASS_MATRIX_X[list(b"0123456789") + list(range(65, 91)) + list(range(97, 123)), -1] = 1.0
# class counts the fast path reads
_C_DIGIT, _C_OP, _C_EQUALS, _C_DOLLAR, _C_CONTROL, _C_HIGH = (
    _CLASS_NAMES.index(k) for k in ("digit", "operator", "equals", "dollar", "control", "non_ascii")
)
_C_ALNUM = _N_CLASSES  # the extra column: ASCII letters and digits

_IS_DIGIT = np.zeros(256, dtype=bool)
_IS_DIGIT[ord("0")] = True  # after folding
_IS_OP = np.zeros(256, dtype=bool)
_IS_OP[list(b"+-*/=<>^")] = True
_IS_ALNUM = np.zeros(256, dtype=bool)
_IS_ALNUM[list(b"abcdefghijklmnopqrstuvwxyz0")] = True
_LATEX_CMD_RE = re.compile(r"\\[a-zA-Z]{2,}")
_TAG_RE = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>\n]{0,80})?>")

# Two-byte patterns counted over the byte pairs of the lower-cased, digit-folded sample.
_PAIR_GROUPS: dict[str, tuple[bytes, ...]] = {
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
_PAIR_TABLE = np.zeros(1 << 16, dtype=np.intp)  # folded pair -> group (1-based), 0 = none
for _g, _pairs_of_group in enumerate(_PAIR_GROUPS.values(), start=1):
    for _p in _pairs_of_group:
        _PAIR_TABLE[_p[0] * 256 + _p[1]] = _g
_N_PAIR_GROUPS = len(_PAIR_GROUPS) + 1
_STRUCT_NAMES = [
    *_PAIR_GROUPS,
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
_COUNT_NAMES = _STRUCT_NAMES + [f"words_{g}" for g in _MARKER_GROUPS]
_N_COUNTS = len(_COUNT_NAMES)

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
    *[f"share_{name}" for name in _CLASS_NAMES],
    "junk_share",
    *[f"count_{name}" for name in _COUNT_NAMES],
    *[f"rate_{name}" for name in _COUNT_NAMES],
]
N_DENSE = len(DENSE_NAMES)
_N_BASE = 11 + _N_CLASSES + 1

# The order `scan` returns the dense vector in: the 11 scalar statistics and the junk share, the class
# shares, the counts, the rates. `dense[FAST_ORDER] = scan(...)[0]` gives the `DENSE_NAMES` order.
FAST_ORDER = np.array(
    [*range(11), _N_BASE - 1, *range(11, 11 + _N_CLASSES), *range(_N_BASE, N_DENSE)], dtype=np.intp
)

_N_CHAR_BINS = 4093
_CHAR_BINS = np.uint32(_N_CHAR_BINS)


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

# ---------------------------------------------------------------------------------------------
# Fast-path tables (derived from the definitions above)

# Byte entropy from the histogram: H = log2(N) - sum(c * log2(c)) / N, with c * log2(c) from a table.
_XLOGX_SIZE = 1 << 15
_XLOGX = np.zeros(_XLOGX_SIZE, dtype=np.float64)
_XLOGX[1:] = np.arange(1, _XLOGX_SIZE) * np.log2(np.arange(1, _XLOGX_SIZE))
_ONES_256 = np.ones(256)
_ASCII_MASK = (np.arange(256) < 128).astype(np.float64)


def _xlogx(k: int) -> float:
    return float(_XLOGX[k]) if k < _XLOGX_SIZE else k * math.log2(k)


# private use, surrogates and supplementary private use, by 256-code-point block (all block-aligned)
_JUNK_BLOCKS = np.zeros(0x1100, dtype=bool)
_JUNK_BLOCKS[0xD8:0xE0] = _JUNK_BLOCKS[0xE0:0xF9] = _JUNK_BLOCKS[0xF00:] = True
_JUNK_BLOCK_BYTES = _JUNK_BLOCKS.astype(np.uint8).tobytes()
_ALNUM_RE = re.compile(r"[^\W_]")  # str.isalnum() characters

_FOLD = np.frombuffer(_LOWER_FOLD, dtype=np.uint8)
_X = np.arange(1 << 16) & 255  # first byte of a pair code (see `_pairs`)
_Y = np.arange(1 << 16) >> 8  # second byte

# Counts. Pattern counts are summed as packed 16-bit fields of uint64 table entries (one take and one
# sum for up to four counts; a sample has fewer than 65536 byte pairs, see MAX_SAMPLE_CHARS). Exclusive
# categories (raw pair groups, lexicon marker combinations) share one bincount.
_FIELD = 16
_FIELD_MASK = (1 << _FIELD) - 1
MAX_SAMPLE_CHARS = PART_CHARS + 1  # what request_text returns at most (head + "\n" + tail)


def _packed(*fields: np.ndarray) -> np.ndarray:
    out = np.zeros(len(fields[0]), dtype=np.uint64)
    for k, f in enumerate(fields):
        out |= f.astype(np.uint64) << np.uint64(_FIELD * k)
    return out


# Bincount ids: raw pairs 1..9 (folded pair group 1..8, camel case 9), lexicon marker combinations
# _OFF_MARKER + k (the marker table's distinct non-empty bit sets); 0 counts nothing.
_MARKER_COMBOS = np.unique(_MARKER_TABLE)  # sorted; [0] == 0
_OFF_MARKER = 16
assert _MARKER_COMBOS[0] == 0 and _OFF_MARKER + len(_MARKER_COMBOS) <= 256
_MARKER_IDS = np.searchsorted(_MARKER_COMBOS, _MARKER_TABLE).astype(np.uint8)  # slot -> combination
_MARKER_IDS[_MARKER_IDS > 0] += _OFF_MARKER
_N_IDS = _OFF_MARKER + len(_MARKER_COMBOS)
_S = {name: _COUNT_NAMES.index(name) for name in _COUNT_NAMES}
_COUNT_MAP = np.zeros((_N_IDS, _N_COUNTS), dtype=np.float64)
for _i, _combo in enumerate(_MARKER_COMBOS.tolist()[1:], start=1):
    for _g in range(len(_MARKER_GROUPS)):
        if _combo >> _g & 1:
            _COUNT_MAP[_OFF_MARKER + _i, len(_STRUCT_NAMES) + _g] = 1.0

# raw pair (x, y): group of the folded pair (fold(x), fold(y)), or camel case (x in a-z, y in A-Z)
_camel = (_X >= 97) & (_X <= 122) & (_Y >= 65) & (_Y <= 90)
_raw_group = _PAIR_TABLE[_FOLD[_X].astype(np.intp) * 256 + _FOLD[_Y]]
assert not (_camel & (_raw_group > 0)).any()
_raw_group[_camel] = _N_PAIR_GROUPS
_RAW_PAIR = _raw_group.astype(np.uint8)
for _g in range(1, _N_PAIR_GROUPS):
    _COUNT_MAP[_g, _g - 1] = 1.0
_COUNT_MAP[_N_PAIR_GROUPS, _S["camel_case"]] = 1.0

# Normalised-text pair (x, y) -> pattern bits p; a triple (x, y, z) is the pairs p[i], p[i + 1], read
# through `_NORM_COUNTS[p[i] << 7 | p[i + 1]]`, whose packed fields count numbers, name(, a.b, a_b.
_B_START, _B_NUM, _B_CALL, _B_DOT_L, _B_DOT_R, _B_US_L, _B_US_R = (1 << k for k in range(7))
_wx, _wy = _WORD_BYTES[_X] == 1, _WORD_BYTES[_Y] == 1
_ax, _ay = _IS_ALNUM[_X], _IS_ALNUM[_Y]
_NORM_PAIR = (
    _B_START * (~_wx & _wy)  # a word starts at y
    + _B_NUM * (~_wx & (_Y == 48))  # ... with a digit
    + _B_CALL * (_wx & (_Y == 40))  # name(
    + _B_DOT_L * (_wx & (_Y == 46))  # a. (then .b: a.b)
    + _B_DOT_R * ((_X == 46) & _wy)
    + _B_US_L * (_ax & (_Y == 95))  # a_ (then _b: a_b)
    + _B_US_R * ((_X == 95) & _ay)
).astype(np.uint8)
_pi, _pj = np.arange(1 << 14) >> 7, np.arange(1 << 14) & 127
_NORM_COUNTS = _packed(
    (_pi & _B_NUM) > 0,
    (_pi & _B_CALL) > 0,
    ((_pi & _B_DOT_L) > 0) & ((_pj & _B_DOT_R) > 0),
    ((_pi & _B_US_L) > 0) & ((_pj & _B_US_R) > 0),
)

# Whitespace-free pair (x, y) -> pattern bits; triples through `_DESPACED_COUNTS[d[i] << 4 | d[i + 1]]`
_B_DIG_OP, _B_OP_DIG, _B_AL_EQ, _B_EQ_ARG = (1 << k for k in range(4))
_DESPACED_PAIR = (
    _B_DIG_OP * (_IS_DIGIT[_X] & _IS_OP[_Y])  # 0+ (then +0: 0+0)
    + _B_OP_DIG * (_IS_OP[_X] & _IS_DIGIT[_Y])
    + _B_AL_EQ * (_IS_ALNUM[_X] & (_Y == 61))  # x= (then =0 or =(: x=0)
    + _B_EQ_ARG * ((_X == 61) & (_IS_DIGIT[_Y] | (_Y == 40)))
).astype(np.uint8)
_di, _dj = np.arange(256) >> 4, np.arange(256) & 15
_DESPACED_COUNTS = _packed(
    ((_di & _B_DIG_OP) > 0) & ((_dj & _B_OP_DIG) > 0),
    ((_di & _B_AL_EQ) > 0) & ((_dj & _B_EQ_ARG) > 0),
)
del _camel, _raw_group, _wx, _wy, _ax, _ay, _pi, _pj, _di, _dj

_SALT_3, _SALT_4, _SALT_5 = _SALTS["char3"], _SALTS["char4"], _SALTS["char5"]
_SALT_WORD, _SALT_BIGRAM, _SALT_FIRST = _SALTS["word"], _SALTS["bigram"], int(_SALTS["first"])
_MULT_0, _MULT_1, _MULT_2, _MULT_3, _MULT_4 = _NGRAM_MULTS
# Char n-gram multipliers as per-byte tables: _NGRAM_TABLE[k, b] = b * mult_k (mod 2**32).
_NGRAM_TABLE = np.arange(256, dtype=np.uint32)[None, :] * np.array(_NGRAM_MULTS, dtype=np.uint32)[:, None]
_I_TAGS, _I_LATEX, _I_EQ_DIGIT, _I_NUMBERS, _I_DOLLAR = (
    _S[k] for k in ("tags", "latex_cmd", "eq_digit", "numbers", "dollar_pairs")
)
assert [_S[k] for k in ("eq_digit", "eq_var", "call_syntax", "dotted", "snake_case")] == list(
    range(_I_EQ_DIGIT, _I_EQ_DIGIT + 5)
)
_log1p = math.log1p
_concatenate = np.concatenate
_bincount = np.bincount
_add_reduce = np.add.reduce
_reduceat = np.add.reduceat


class Features:
    """Dense vector (`DENSE_NAMES` order) + hashed bucket ids of one request sample."""

    __slots__ = ("buckets", "dense", "junk")

    def __init__(self, dense: np.ndarray, buckets: np.ndarray, junk: float) -> None:
        self.dense = dense
        self.buckets = buckets
        self.junk = junk


def scan(sample: str, full_len: int) -> tuple[np.ndarray, np.ndarray, float, bool] | None:
    """The features of a sample in one go: `(dense in FAST_ORDER, bucket ids (intp), junk, has_alnum)`.

    None for an empty or whitespace-only sample; `has_alnum` says whether it has any letter or digit.
    A sample longer than `MAX_SAMPLE_CHARS` (more than `request_text` returns) is read as its head and
    tail, as `request_text` would. Every array is fresh (no shared buffers: safe from several threads).
    """
    n_chars = len(sample)
    if n_chars > MAX_SAMPLE_CHARS:
        sample = _head_tail(sample)
        n_chars = len(sample)
    if n_chars == 0 or sample.isspace():
        return None
    raw = sample.encode("utf-8", errors="surrogatepass")
    n_bytes = len(raw)

    # byte histogram: class shares, entropy, control characters
    counts = _bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
    cc = counts @ _CLASS_MATRIX_X
    ccl = cc.tolist()
    n_digit, n_op, n_equals, n_dollar = ccl[_C_DIGIT], ccl[_C_OP], ccl[_C_EQUALS], ccl[_C_DOLLAR]
    n_control, n_alnum, n_high = ccl[_C_CONTROL], ccl[_C_ALNUM], ccl[_C_HIGH]
    xlogx = _XLOGX.take(counts)
    byte_h = max(0.0, math.log2(n_bytes) - float(xlogx @ _ONES_256) / n_bytes)
    bad = int(n_control)
    if n_bytes == n_chars:  # ASCII
        char_h = byte_h
        has_alnum = n_alnum > 0
    else:  # character entropy over code points hashed to 4093 bins, as the reference computes it
        cps = np.frombuffer(sample.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        n_non_ascii = n_chars - (n_bytes - int(n_high))
        if n_non_ascii <= 64:  # few: ASCII characters are the ASCII bytes, the others in Python
            others = cps[cps >= 128].tolist()
            bins = Counter(cp % _N_CHAR_BINS for cp in others)
            total = float(xlogx @ _ASCII_MASK)
            for b, k in bins.items():
                if b < 128:  # a code point that shares an ASCII character's bin
                    c0 = int(counts[b])
                    total += _xlogx(c0 + k) - _xlogx(c0)
                else:
                    total += _xlogx(k)
            char_h = max(0.0, math.log2(n_chars) - total / n_chars)
            bad += sum(_JUNK_BLOCK_BYTES[cp >> 8] for cp in others)
            has_alnum = n_alnum > 0 or any(chr(cp).isalnum() for cp in others)
        else:
            char_counts = _bincount(cps % _CHAR_BINS, minlength=_CHAR_BINS)
            char_h = max(0.0, math.log2(n_chars) - float(_add_reduce(_XLOGX.take(char_counts))) / n_chars)
            bad += int(_add_reduce(_JUNK_BLOCKS.take(cps >> 8)))
            has_alnum = n_alnum > 0 or _ALNUM_RE.search(sample) is not None
        bad += sample.count("\ufffd")
    junk = min(1.0, bad / n_chars)
    if "\n" in sample:
        lines = sample.split("\n")
        n_lines = len(lines)
        max_line = max(map(len, lines))
        blank = sample.count("\n\n") / n_lines
    else:
        n_lines, max_line, blank = 1, n_chars, 0.0

    # normalised text: lower-cased, digits folded, whitespace runs folded to one space, padded
    folded = raw.translate(_LOWER_FOLD)
    norm = b" " + b" ".join(folded.split()) + b" "
    n = len(norm)  # >= 3: the sample has a non-whitespace byte
    pairs = _pairs(norm)
    p = _NORM_PAIR.take(pairs)
    starts = (p & _B_START).view(bool).nonzero()[0]  # a word starts at byte starts[k] + 1
    n_words = starts.size
    q = np.left_shift(p[:-1], 7, dtype=np.int16)
    q |= p[1:]
    packed = int(_add_reduce(_NORM_COUNTS.take(q)))
    n_numbers = packed & _FIELD_MASK
    call = (packed >> 16) & _FIELD_MASK
    dotted = (packed >> 32) & _FIELD_MASK
    snake = packed >> 48
    despaced = folded.translate(None, _ASCII_WS) if (n_digit and n_op) or n_equals else b""
    if len(despaced) >= 3:  # 0+0 needs a digit and an operator, x=0 an `=`
        d = _DESPACED_PAIR.take(_pairs(despaced))
        q = d[:-1] << 4
        q |= d[1:]
        packed = int(_add_reduce(_DESPACED_COUNTS.take(q)))
        eq_digit, eq_var = packed & _FIELD_MASK, packed >> 16
    else:
        eq_digit = eq_var = 0

    # n-gram keys, written in place: [3-grams | 4-grams | 5-grams | words | first word | word bigrams]
    n3, n4, n5 = n - 2, max(n - 3, 0), max(n - 4, 0)
    o_words = n3 + n4 + n5
    keys = np.empty(o_words + 2 * n_words, dtype=np.uint32)
    h3 = keys[:n3]
    h4 = keys[n3 : n3 + n4]
    h5 = keys[n3 + n4 : o_words]
    if n < 1024:  # one (5, n) table lookup: fewer calls
        m0, m1, m2, m3, m4 = _NGRAM_TABLE.take(np.frombuffer(norm, dtype=np.uint8), axis=1)
        np.add(m0[:n3], m1[1 : n3 + 1], out=h3)
        h3 += m2[2:]
        np.add(h3[:n4], m3[3:], out=h4)
        np.add(h4[:n5], m4[4:], out=h5)
    else:  # multiplications: less memory traffic
        a = np.frombuffer(norm, dtype=np.uint8).astype(np.uint32)
        np.multiply(a[:n3], _MULT_0, out=h3)
        m = a * _MULT_1
        h3 += m[1 : n3 + 1]
        np.multiply(a, _MULT_2, out=m)
        h3 += m[2:]
        np.multiply(a[3:], _MULT_3, out=h4)
        h4 += h3[:n4]
        np.multiply(a[4:], _MULT_4, out=h5)
        h5 += h4[:n5]
    h3 ^= _SALT_3
    h4 ^= _SALT_4
    h5 ^= _SALT_5
    ids = []
    if n_bytes >= 2:
        groups = _RAW_PAIR.take(_pairs(raw))
        ids.append(groups[groups != 0] if n_bytes > 256 else groups)  # (bincount is slow per element)
    if n_words:
        # word keys then bigram keys; salted into `keys`, and looked up in the marker lexicon
        words = np.empty(2 * n_words - 1, dtype=np.uint32)
        _reduceat(_T12.take(pairs)[1:], starts, out=words[:n_words])  # contributions from byte 1 on
        bigrams = words[n_words:]
        np.multiply(words[: n_words - 1], _BIGRAM_MULT, out=bigrams)
        bigrams += words[1:n_words]
        np.bitwise_xor(words[:n_words], _SALT_WORD, out=keys[o_words : o_words + n_words])
        keys[o_words + n_words] = int(words[0]) ^ _SALT_FIRST
        np.bitwise_xor(bigrams, _SALT_BIGRAM, out=keys[o_words + n_words + 1 :])
        words ^= _MARKER_SALT
        words *= _FINAL
        words >>= _MARKER_SHIFT
        ids.append(_MARKER_IDS.take(words))
    keys *= _FINAL
    buckets = np.right_shift(keys, _SHIFT, out=np.empty(keys.size, dtype=np.intp))

    c = _bincount(_concatenate(ids), minlength=_N_IDS) @ _COUNT_MAP if ids else np.zeros(_N_COUNTS)
    if eq_digit or eq_var or call or dotted or snake:
        c[_I_EQ_DIGIT : _I_EQ_DIGIT + 5] = (eq_digit, eq_var, call, dotted, snake)
    if n_numbers:
        c[_I_NUMBERS] = n_numbers
    if "<" in sample:
        c[_I_TAGS] = len(_TAG_RE.findall(sample))
    if "\\" in sample:
        c[_I_LATEX] = len(_LATEX_CMD_RE.findall(sample))
    dollars = int(n_dollar) // 2
    if dollars:
        c[_I_DOLLAR] = dollars
    rates = c * (1000.0 / (n_chars + 100.0))
    np.log1p(rates, out=rates)
    base = (
        _log1p(full_len),
        _log1p(n_chars),
        _log1p(n_lines),
        _log1p(n_chars / n_lines),
        _log1p(max_line),
        blank,
        _log1p(n_words),
        _log1p(n_bytes / n_words) if n_words else 0.0,
        byte_h / 8.0,
        char_h / 8.0,
        char_h / math.log2(n_chars + 1),
        junk,
    )
    cc /= n_bytes
    dense = _concatenate((base, cc[:_N_CLASSES], np.log1p(c), rates))
    return dense, buckets, junk, has_alnum


def extract(sample: str, full_len: int | None = None) -> Features:
    """Features of a request sample (see `request_text`); `full_len` is the untruncated length."""
    if full_len is None:
        full_len = len(sample)
    dense = np.zeros(N_DENSE, dtype=np.float64)
    scanned = scan(sample, full_len)
    if scanned is None:
        dense[0] = math.log1p(full_len)
        dense[1] = math.log1p(min(len(sample), MAX_SAMPLE_CHARS))
        return Features(dense, np.zeros(0, dtype=np.intp), 0.0)
    fast, buckets, junk, _ = scanned
    dense[FAST_ORDER] = fast
    return Features(dense, buckets, junk)
