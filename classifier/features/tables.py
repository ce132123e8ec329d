"""Lookup tables of the fast path (`classifier.features.fast.scan`), derived from the definitions
of `dense`, `hashing` and `lexicon` once at import.

* class counts: the byte-class matrix plus a column for ASCII letters and digits;
* entropy: a `c * log2(c)` table, so a byte histogram gives the entropy in one dot product;
* junk: the code-point blocks of private use and surrogates;
* counts: pattern counts are summed as packed 16-bit fields of uint64 table entries (one take and one
  sum for up to four counts); exclusive categories (raw pair groups, lexicon marker combinations) share
  one bincount whose ids map to the count vector through `COUNT_MAP`;
* byte pairs of the normalised and of the whitespace-free text -> pattern bits; a byte triple is two
  adjacent pairs, `bits[i] << k | bits[i + 1]`;
* char n-gram multipliers as per-byte tables;
* the scalar operands of `scan`'s ufunc calls (salts, multipliers, shifts, masks) as read-only 0-d
  arrays: numpy 2 resolves a 0-d array operand much faster than a numpy or Python scalar (about 0.5 us
  less per call, measured; `scan` makes some twenty such calls).
"""

from __future__ import annotations

import math
import re

import numpy as np

from classifier.features.dense import (
    CLASS_MATRIX,
    CLASS_NAMES,
    COUNT_NAMES,
    IS_ALNUM,
    IS_DIGIT,
    IS_OP,
    N_CHAR_BINS,
    N_CLASSES,
    N_COUNTS,
    N_PAIR_GROUPS,
    PAIR_TABLE,
    STRUCT_NAMES,
)
from classifier.features.hashing import (
    BIGRAM_MULT,
    CHAR_FOLD,
    FINAL,
    LOWER_FOLD,
    NGRAM_MULTS,
    SALTS,
    SHIFT,
    SPLIT_LEAD,
    SYMBOLS,
    WORD_BYTES,
)
from classifier.features.lexicon import MARKER_GROUPS, MARKER_SALT, MARKER_SHIFT, MARKER_TABLE

# the fast path adds columns to know whether the text has any ASCII letters and digits, lead bytes of
# characters `hashing.CHAR_FOLD` maps (no fold needed without), lead bytes of split characters
CLASS_MATRIX_X = np.hstack([CLASS_MATRIX, np.zeros((256, 3))])
CLASS_MATRIX_X[list(b"0123456789") + list(range(65, 91)) + list(range(97, 123)), N_CLASSES] = 1.0
CLASS_MATRIX_X[CHAR_FOLD.leads, N_CLASSES + 1] = 1.0
CLASS_MATRIX_X[SPLIT_LEAD, N_CLASSES + 2] = 1.0
# class counts the fast path reads
C_DIGIT, C_OP, C_EQUALS, C_DOLLAR, C_CONTROL, C_HIGH = (
    CLASS_NAMES.index(k) for k in ("digit", "operator", "equals", "dollar", "control", "non_ascii")
)
C_ALNUM, C_FOLD_LEAD, C_SPLIT_LEAD = N_CLASSES, N_CLASSES + 1, N_CLASSES + 2  # the extra columns

# Non-ASCII marks in the class shares: code point (BMP; higher ones read as U+FFFF, no mark) -> id,
# id -> the class counts of its ASCII stand-in (`hashing.SYMBOLS`)
SYMBOL_IDS = np.zeros(1 << 16, dtype=np.uint8)
SYMBOL_CLASSES = np.zeros((len(SYMBOLS) + 1, CLASS_MATRIX_X.shape[1]))
for _k, (_ch, _stand_in) in enumerate(SYMBOLS.items(), start=1):
    SYMBOL_IDS[ord(_ch)] = _k
    SYMBOL_CLASSES[_k] = CLASS_MATRIX_X[ord(_stand_in)]
N_SYMBOL_IDS = len(SYMBOLS) + 1
SYMBOL_CPS = frozenset(map(ord, SYMBOLS))
assert SYMBOL_IDS[0xFFFF] == 0

# Byte entropy from the histogram: H = log2(N) - sum(c * log2(c)) / N, with c * log2(c) from a table.
_XLOGX_SIZE = 1 << 15
XLOGX = np.zeros(_XLOGX_SIZE, dtype=np.float64)
XLOGX[1:] = np.arange(1, _XLOGX_SIZE) * np.log2(np.arange(1, _XLOGX_SIZE))
ONES_256 = np.ones(256)
ASCII_MASK = (np.arange(256) < 128).astype(np.float64)


def xlog2x(k: int) -> float:
    return float(XLOGX[k]) if k < _XLOGX_SIZE else k * math.log2(k)


# private use, surrogates and supplementary private use, by 256-code-point block (all block-aligned)
JUNK_BLOCKS = np.zeros(0x1100, dtype=bool)
JUNK_BLOCKS[0xD8:0xE0] = JUNK_BLOCKS[0xE0:0xF9] = JUNK_BLOCKS[0xF00:] = True
JUNK_BLOCK_BYTES = JUNK_BLOCKS.astype(np.uint8).tobytes()
JUNK_FROM = 0xD800  # the first junk code point: none below it
assert not JUNK_BLOCKS[: JUNK_FROM >> 8].any() and JUNK_BLOCKS[JUNK_FROM >> 8]
ALNUM_RE = re.compile(r"[^\W_]")  # str.isalnum() characters

_FOLD = np.frombuffer(LOWER_FOLD, dtype=np.uint8)
_X = np.arange(1 << 16) & 255  # first byte of a pair code (see `byte_pairs`)
_Y = np.arange(1 << 16) >> 8  # second byte

# Counts. Pattern counts are summed as packed 16-bit fields of uint64 table entries (one take and one
# sum for up to four counts; a sample has fewer than 65536 byte pairs, see MAX_SAMPLE_CHARS). Exclusive
# categories (raw pair groups, lexicon marker combinations) share one bincount.
_FIELD = 16
FIELD_MASK = (1 << _FIELD) - 1


def _packed(*fields: np.ndarray) -> np.ndarray:
    out = np.zeros(len(fields[0]), dtype=np.uint64)
    for k, f in enumerate(fields):
        out |= f.astype(np.uint64) << np.uint64(_FIELD * k)
    return out


# Bincount ids: raw pairs 1..9 (folded pair group 1..8, camel case 9), lexicon marker combinations
# _OFF_MARKER + k (the marker table's distinct non-empty bit sets); 0 counts nothing.
_MARKER_COMBOS = np.unique(MARKER_TABLE)  # sorted; [0] == 0
_OFF_MARKER = 16
assert _MARKER_COMBOS[0] == 0 and _OFF_MARKER + len(_MARKER_COMBOS) <= 256
MARKER_IDS = np.searchsorted(_MARKER_COMBOS, MARKER_TABLE).astype(np.uint8)  # slot -> combination
MARKER_IDS[MARKER_IDS > 0] += _OFF_MARKER
N_IDS = _OFF_MARKER + len(_MARKER_COMBOS)
_S = {name: COUNT_NAMES.index(name) for name in COUNT_NAMES}
COUNT_MAP = np.zeros((N_IDS, N_COUNTS), dtype=np.float64)
for _i, _combo in enumerate(_MARKER_COMBOS.tolist()[1:], start=1):
    for _g in range(len(MARKER_GROUPS)):
        if _combo >> _g & 1:
            COUNT_MAP[_OFF_MARKER + _i, len(STRUCT_NAMES) + _g] = 1.0

# raw pair (x, y): group of the folded pair (fold(x), fold(y)), or camel case (x in a-z, y in A-Z)
_camel = (_X >= 97) & (_X <= 122) & (_Y >= 65) & (_Y <= 90)
_raw_group = PAIR_TABLE[_FOLD[_X].astype(np.intp) * 256 + _FOLD[_Y]]
assert not (_camel & (_raw_group > 0)).any()
_raw_group[_camel] = N_PAIR_GROUPS
RAW_PAIR = _raw_group.astype(np.uint8)
for _g in range(1, N_PAIR_GROUPS):
    COUNT_MAP[_g, _g - 1] = 1.0
COUNT_MAP[N_PAIR_GROUPS, _S["camel_case"]] = 1.0

# Normalised-text pair (x, y) -> pattern bits p; a triple (x, y, z) is the pairs p[i], p[i + 1], read
# through `NORM_COUNTS[p[i] << 7 | p[i + 1]]`, whose packed fields count numbers, name(, a.b, a_b.
B_START, B_NUM, _B_CALL, _B_DOT_L, _B_DOT_R, _B_US_L, _B_US_R = (1 << k for k in range(7))
_B_NUM = B_NUM
_wx, _wy = WORD_BYTES[_X] == 1, WORD_BYTES[_Y] == 1
_ax, _ay = IS_ALNUM[_X], IS_ALNUM[_Y]
NORM_PAIR = (
    B_START * ((~_wx & _wy) | SPLIT_LEAD[_Y])  # a word starts at y
    + _B_NUM * (~_wx & (_Y == 48))  # ... with a digit
    + _B_CALL * (_wx & (_Y == 40))  # name(
    + _B_DOT_L * (_wx & (_Y == 46))  # a. (then .b: a.b)
    + _B_DOT_R * ((_X == 46) & _wy)
    + _B_US_L * (_ax & (_Y == 95))  # a_ (then _b: a_b)
    + _B_US_R * ((_X == 95) & _ay)
).astype(np.uint8)
_pi, _pj = np.arange(1 << 14) >> 7, np.arange(1 << 14) & 127
NORM_COUNTS = _packed(
    (_pi & _B_NUM) > 0,
    (_pi & _B_CALL) > 0,
    ((_pi & _B_DOT_L) > 0) & ((_pj & _B_DOT_R) > 0),
    ((_pi & _B_US_L) > 0) & ((_pj & _B_US_R) > 0),
)

# Whitespace-free pair (x, y) -> pattern bits; triples through `DESPACED_COUNTS[d[i] << 4 | d[i + 1]]`
_B_DIG_OP, _B_OP_DIG, _B_AL_EQ, _B_EQ_ARG = (1 << k for k in range(4))
DESPACED_PAIR = (
    _B_DIG_OP * (IS_DIGIT[_X] & IS_OP[_Y])  # 0+ (then +0: 0+0)
    + _B_OP_DIG * (IS_OP[_X] & IS_DIGIT[_Y])
    + _B_AL_EQ * (IS_ALNUM[_X] & (_Y == 61))  # x= (then =0 or =(: x=0)
    + _B_EQ_ARG * ((_X == 61) & (IS_DIGIT[_Y] | (_Y == 40)))
).astype(np.uint8)
_di, _dj = np.arange(256) >> 4, np.arange(256) & 15
DESPACED_COUNTS = _packed(
    ((_di & _B_DIG_OP) > 0) & ((_dj & _B_OP_DIG) > 0),
    ((_di & _B_AL_EQ) > 0) & ((_dj & _B_EQ_ARG) > 0),
)
del _camel, _raw_group, _wx, _wy, _ax, _ay, _pi, _pj, _di, _dj

# Char n-gram multipliers as per-byte tables: NGRAM_TABLE[k, b] = b * mult_k (mod 2**32).
NGRAM_TABLE = np.arange(256, dtype=np.uint32)[None, :] * np.array(NGRAM_MULTS, dtype=np.uint32)[:, None]
I_TAGS, I_LATEX, I_EQ_DIGIT, I_NUMBERS, I_DOLLAR = (
    _S[k] for k in ("tags", "latex_cmd", "eq_digit", "numbers", "dollar_pairs")
)
assert [_S[k] for k in ("eq_digit", "eq_var", "call_syntax", "dotted", "snake_case")] == list(
    range(I_EQ_DIGIT, I_EQ_DIGIT + 5)
)


def operand(value: int, dtype: type[np.generic] = np.uint32) -> np.ndarray:
    """A read-only 0-d array: a ufunc operand numpy resolves faster than a scalar (same result dtype
    as the scalar gives with arrays of that dtype)."""
    out = np.array(value, dtype=dtype)
    out.flags.writeable = False
    return out


# uint32 operands of the n-gram, word and bucket hashing (see `hashing`, `lexicon`)
OP_SALT_3, OP_SALT_4, OP_SALT_5, OP_SALT_WORD, OP_SALT_BIGRAM = (
    operand(SALTS[k]) for k in ("char3", "char4", "char5", "word", "bigram")
)
OP_MULTS = tuple(operand(m) for m in NGRAM_MULTS)
OP_BIGRAM_MULT, OP_FINAL, OP_SHIFT = operand(BIGRAM_MULT), operand(FINAL), operand(SHIFT)
OP_MARKER_SALT, OP_MARKER_SHIFT = operand(MARKER_SALT), operand(MARKER_SHIFT)
# code points (uint32): the ASCII bound, the 4093 entropy bins, the 256-code-point blocks, the BMP
OP_128, OP_CHAR_BINS, OP_8, OP_BMP = operand(128), operand(N_CHAR_BINS), operand(8), operand(0xFFFF)
# pattern bits: the word-start bit (uint8), the shifts that pair adjacent bits into a triple
OP_B_START = operand(B_START, np.uint8)
OP_NORM_SHIFT = operand(7, np.int16)  # NORM_PAIR bits < 128: a triple code < 2**14 (int16)
OP_DESPACED_SHIFT = operand(4, np.uint8)  # DESPACED_PAIR bits < 16: a triple code < 256 (uint8)
