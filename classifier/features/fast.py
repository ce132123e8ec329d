"""The fast path: `scan` computes every feature of a sample with a fixed number of C-level passes
(about 50 numpy calls whatever the length) and no Python loop over characters; `extract` wraps it.

* one byte histogram gives the class shares (one matmul), the byte entropy (a `c*log2(c)` table), the
  control characters and which pattern families can occur at all;
* the byte *pairs* of the raw, the whitespace-folded and the whitespace-free text are read as uint16
  through a stride-1 view of the bytes (no copy) and looked up in 64K tables of pattern bits; a byte
  *triple* (`a.b`, `a_b`, `0+0`, `x=0`) is two adjacent pairs, `bits[i] << k | bits[i + 1]`;
* pattern counts are summed as packed 16-bit fields of uint64 table entries (one gather and one sum
  for four counts); the exclusive categories (raw pair groups, lexicon marker combinations) share one
  bincount and one small matmul;
* word hashes are one table lookup per byte pair (`T1[x] + T2[x, y]` pre-added) and one `reduceat`;
  the n-gram keys are written with `out=` into one preallocated uint32 array and finalised in place
  into the bucket ids (uint32: `take` casts its indices itself, cheaper than an intp copy);
* per-call overhead is most of the cost of a short prompt, so the calls are the cheap forms: scalar
  operands as read-only 0-d arrays (`tables.OP_*`), `.dot` rather than `@`, positional arguments,
  dtype objects; whitespace is folded by the byte translation, a split and join only for runs.
* non-ASCII text: the character entropy reuses the byte histogram for the ASCII characters and adds the
  (few) other code points in Python, or bins all code points when there are many.

The tables live in `classifier.features.tables`; they are imported as module globals here, so the hot
loop reads them without attribute lookups.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from classifier.features.dense import (
    FAST_ORDER,
    LATEX_CMD_RE,
    N_CHAR_BINS,
    N_CLASSES,
    N_COUNTS,
    N_DENSE,
    RATE_WORDS,
    TAG_RE,
)
from classifier.features.hashing import (
    ASCII_WORD,
    CHAR_FOLD,
    LOWER_FOLD_WS,
    SALTS,
    SPLIT_LEN,
    T12,
    byte_pairs,
    fold_spaces,
)
from classifier.features.tables import (
    ALNUM_RE,
    ASCII_MASK,
    B_NUM,
    B_START,
    C_ALNUM,
    C_CONTROL,
    C_DIGIT,
    C_DOLLAR,
    C_EQUALS,
    C_FOLD_LEAD,
    C_HIGH,
    C_OP,
    C_SPLIT_LEAD,
    CLASS_MATRIX_X,
    COUNT_MAP,
    DESPACED_COUNTS,
    DESPACED_PAIR,
    FIELD_MASK,
    I_DOLLAR,
    I_EQ_DIGIT,
    I_LATEX,
    I_NUMBERS,
    I_TAGS,
    JUNK_BLOCK_BYTES,
    JUNK_BLOCKS,
    JUNK_FROM,
    MARKER_IDS,
    N_IDS,
    N_SYMBOL_IDS,
    NGRAM_TABLE,
    NORM_COUNTS,
    NORM_PAIR,
    ONES_256,
    OP_8,
    OP_128,
    OP_B_START,
    OP_BIGRAM_MULT,
    OP_BMP,
    OP_CHAR_BINS,
    OP_DESPACED_SHIFT,
    OP_FINAL,
    OP_MARKER_SALT,
    OP_MARKER_SHIFT,
    OP_MULTS,
    OP_NORM_SHIFT,
    OP_SALT_3,
    OP_SALT_4,
    OP_SALT_5,
    OP_SALT_BIGRAM,
    OP_SALT_WORD,
    OP_SHIFT,
    RAW_PAIR,
    SYMBOL_CLASSES,
    SYMBOL_CPS,
    SYMBOL_IDS,
    XLOGX,
    xlog2x,
)
from classifier.features.text import MAX_SAMPLE_CHARS, head_tail

_SALT_FIRST = int(SALTS["first"])
_MULT_0, _MULT_1, _MULT_2, _MULT_3, _MULT_4 = OP_MULTS
_U8, _U32 = np.dtype(np.uint8), np.dtype(np.uint32)
_frombuffer = np.frombuffer
_empty = np.empty
_log1p = math.log1p
_concatenate = np.concatenate
_bincount = np.bincount
_add_reduce = np.add.reduce
_reduceat = np.add.reduceat
_char_fold = CHAR_FOLD.fold


class Features:
    """Dense vector (`DENSE_NAMES` order) + hashed bucket ids of one request sample."""

    __slots__ = ("buckets", "dense", "junk")

    def __init__(self, dense: np.ndarray, buckets: np.ndarray, junk: float) -> None:
        self.dense = dense
        self.buckets = buckets
        self.junk = junk


def scan(sample: str, full_len: int) -> tuple[np.ndarray, np.ndarray, float, bool] | None:
    """The features of a sample in one go: `(dense in FAST_ORDER, bucket ids (uint32), junk, has_alnum)`.

    None for an empty or whitespace-only sample; `has_alnum` says whether it has any letter or digit.
    A sample longer than `MAX_SAMPLE_CHARS` (more than `request_text` returns) is read as its head and
    tail, as `request_text` would. Every array is fresh (no shared buffers: safe from several threads).
    """
    n_chars = len(sample)
    if n_chars > MAX_SAMPLE_CHARS:
        sample = head_tail(sample)
        n_chars = len(sample)
    if n_chars == 0 or sample.isspace():
        return None
    raw = sample.encode("utf-8", "surrogatepass")
    n_bytes = len(raw)

    # byte histogram: class shares, entropy, control characters
    counts = _bincount(_frombuffer(raw, _U8), None, 256)
    cc = counts.dot(CLASS_MATRIX_X)
    ccl = cc.tolist()
    n_digit, n_op, n_equals, n_dollar = ccl[C_DIGIT], ccl[C_OP], ccl[C_EQUALS], ccl[C_DOLLAR]
    n_control, n_alnum, n_high = ccl[C_CONTROL], ccl[C_ALNUM], ccl[C_HIGH]
    xlogx = XLOGX.take(counts)
    byte_h = max(0.0, math.log2(n_bytes) - float(xlogx.dot(ONES_256)) / n_bytes)
    bad = int(n_control)
    if n_bytes == n_chars:  # ASCII
        char_h = byte_h
        has_alnum = n_alnum > 0
        folded = raw.translate(LOWER_FOLD_WS)
        check_eq = (n_digit and n_op) or n_equals
        raw_pairs = None
    else:  # character entropy over code points hashed to 4093 bins, as the reference computes it
        cps = _frombuffer(sample.encode("utf-32-le", "surrogatepass"), _U32)
        n_non_ascii = n_chars - (n_bytes - int(n_high))  # characters, not bytes
        if n_non_ascii <= 64:  # few: ASCII characters are the ASCII bytes, the others in Python
            hi = cps[cps >= OP_128]
            others = hi.tolist()
            total = float(xlogx.dot(ASCII_MASK))
            for b, k in Counter((hi % OP_CHAR_BINS).tolist()).items():
                if b < 128:  # a code point that shares an ASCII character's bin
                    c0 = int(counts[b])
                    total += xlog2x(c0 + k) - xlog2x(c0)
                else:
                    total += xlog2x(k)
            char_h = max(0.0, math.log2(n_chars) - total / n_chars)
            if max(others) >= JUNK_FROM:
                bad += sum(JUNK_BLOCK_BYTES[cp >> 8] for cp in others)
            has_alnum = n_alnum > 0 or any(chr(cp).isalnum() for cp in others)
            has_marks = not SYMBOL_CPS.isdisjoint(others)
        else:
            hi = cps
            char_counts = _bincount(cps % OP_CHAR_BINS, None, N_CHAR_BINS)
            char_h = max(0.0, math.log2(n_chars) - float(_add_reduce(XLOGX.take(char_counts))) / n_chars)
            bad += int(_add_reduce(JUNK_BLOCKS.take(cps >> OP_8)))
            has_alnum = n_alnum > 0 or ALNUM_RE.search(sample) is not None
            has_marks = True
        bad += sample.count("\ufffd")
        # cased scripts lower-cased, non-ASCII marks folded to ASCII (`hashing.FOLD_MAP`)
        raw_pairs = byte_pairs(raw)
        folded = (_char_fold(raw, raw_pairs) if ccl[C_FOLD_LEAD] else raw).translate(LOWER_FOLD_WS)
        if has_marks:  # class shares: a mark counts as its ASCII stand-in too
            ids = SYMBOL_IDS.take(np.minimum(hi, OP_BMP))
            if ids.any():
                cc += _bincount(ids, None, N_SYMBOL_IDS).dot(SYMBOL_CLASSES)
                n_digit, n_op, n_equals = cc[C_DIGIT], cc[C_OP], cc[C_EQUALS]
        cc[C_HIGH] = n_non_ascii
        # folded digits and operators are counted with their marks: as many as `folded` has, or more
        check_eq = (n_digit and n_op) or n_equals
    junk = min(1.0, bad / n_chars)
    if "\n" in sample:
        lines = sample.split("\n")
        n_lines = len(lines)
        max_line = max(map(len, lines))
        blank = sample.count("\n\n") / n_lines
    else:
        n_lines, max_line, blank = 1, n_chars, 0.0

    # normalised text: lower-cased, digits folded, whitespace runs folded to one space, padded
    norm = fold_spaces(folded)
    n = len(norm)  # >= 3: the sample has a non-whitespace byte
    pairs = byte_pairs(norm)
    p = NORM_PAIR.take(pairs)
    if ccl[C_SPLIT_LEAD]:  # an ASCII word byte right after a split character starts a word as well
        a8 = _frombuffer(norm, _U8)
        after = SPLIT_LEN.take(a8).nonzero()[0]
        if after.size:
            after += SPLIT_LEN.take(a8.take(after))
            after = after[after < n]
            after = after[ASCII_WORD.take(a8.take(after))]
            if after.size:
                p[after - 1] |= np.where(a8.take(after) == 48, B_START | B_NUM, B_START).astype(np.uint8)
    starts = np.bitwise_and(p, OP_B_START).nonzero()[0]  # a word starts at byte starts[k] + 1
    n_words = starts.size
    q = np.left_shift(p[:-1], OP_NORM_SHIFT)  # int16
    q |= p[1:]
    packed = int(_add_reduce(NORM_COUNTS.take(q)))
    n_numbers = packed & FIELD_MASK
    call = (packed >> 16) & FIELD_MASK
    dotted = (packed >> 32) & FIELD_MASK
    snake = packed >> 48
    despaced = folded.translate(None, b" ") if check_eq else b""
    if len(despaced) >= 3:  # 0+0 needs a digit and an operator, x=0 an `=`
        d = DESPACED_PAIR.take(byte_pairs(despaced))
        q = np.left_shift(d[:-1], OP_DESPACED_SHIFT)
        q |= d[1:]
        packed = int(_add_reduce(DESPACED_COUNTS.take(q)))
        eq_digit, eq_var = packed & FIELD_MASK, packed >> 16
    else:
        eq_digit = eq_var = 0

    # n-gram keys, written in place: [3-grams | 4-grams | 5-grams | words | first word | word bigrams]
    n3, n4, n5 = n - 2, max(n - 3, 0), max(n - 4, 0)
    o_words = n3 + n4 + n5
    keys = _empty(o_words + 2 * n_words, _U32)
    h3 = keys[:n3]
    h4 = keys[n3 : n3 + n4]
    h5 = keys[n3 + n4 : o_words]
    if n < 1024:  # one (5, n) table lookup: fewer calls
        m0, m1, m2, m3, m4 = NGRAM_TABLE.take(_frombuffer(norm, _U8), 1)
        np.add(m0[:n3], m1[1 : n3 + 1], out=h3)
        h3 += m2[2:]
        np.add(h3[:n4], m3[3:], out=h4)
        np.add(h4[:n5], m4[4:], out=h5)
    else:  # multiplications: less memory traffic
        a = _frombuffer(norm, _U8).astype(_U32)
        np.multiply(a[:n3], _MULT_0, out=h3)
        m = a * _MULT_1
        h3 += m[1 : n3 + 1]
        np.multiply(a, _MULT_2, out=m)
        h3 += m[2:]
        np.multiply(a[3:], _MULT_3, out=h4)
        h4 += h3[:n4]
        np.multiply(a[4:], _MULT_4, out=h5)
        h5 += h4[:n5]
    h3 ^= OP_SALT_3
    h4 ^= OP_SALT_4
    h5 ^= OP_SALT_5
    ids = []
    if n_bytes >= 2:
        groups = RAW_PAIR.take(byte_pairs(raw) if raw_pairs is None else raw_pairs)
        ids.append(groups[groups != 0] if n_bytes > 256 else groups)  # (bincount is slow per element)
    if n_words:
        # word keys then bigram keys; salted into `keys`, and looked up in the marker lexicon
        words = _empty(2 * n_words - 1, _U32)
        _reduceat(T12.take(pairs)[1:], starts, 0, None, words[:n_words])  # contributions from byte 1 on
        bigrams = words[n_words:]
        np.multiply(words[: n_words - 1], OP_BIGRAM_MULT, bigrams)
        bigrams += words[1:n_words]
        np.bitwise_xor(words[:n_words], OP_SALT_WORD, keys[o_words : o_words + n_words])
        keys[o_words + n_words] = int(words[0]) ^ _SALT_FIRST
        np.bitwise_xor(bigrams, OP_SALT_BIGRAM, keys[o_words + n_words + 1 :])
        words ^= OP_MARKER_SALT
        words *= OP_FINAL
        words >>= OP_MARKER_SHIFT
        ids.append(MARKER_IDS.take(words))
    keys *= OP_FINAL
    keys >>= OP_SHIFT  # the bucket ids, uint32 (`take` casts them itself, cheaper than an intp copy)

    if len(ids) == 2:
        c = _bincount(_concatenate(ids), None, N_IDS).dot(COUNT_MAP)
    else:
        c = _bincount(ids[0], None, N_IDS).dot(COUNT_MAP) if ids else np.zeros(N_COUNTS)
    if eq_digit or eq_var or call or dotted or snake:
        c[I_EQ_DIGIT : I_EQ_DIGIT + 5] = (eq_digit, eq_var, call, dotted, snake)
    if n_numbers:
        c[I_NUMBERS] = n_numbers
    if "<" in sample:
        c[I_TAGS] = len(TAG_RE.findall(sample))
    if "\\" in sample:
        c[I_LATEX] = len(LATEX_CMD_RE.findall(sample))
    dollars = int(n_dollar) // 2
    if dollars:
        c[I_DOLLAR] = dollars
    rates = c * (RATE_WORDS / (n_words + RATE_WORDS))
    np.log1p(rates, out=rates)
    base = (
        _log1p(full_len),
        _log1p(n_chars),
        _log1p(n_lines),
        _log1p(n_chars / n_lines),
        _log1p(max_line),
        blank,
        _log1p(n_words),
        _log1p(n_chars / n_words) if n_words else 0.0,
        byte_h / 8.0,
        char_h / 8.0,
        char_h / math.log2(n_chars + 1),
        junk,
    )
    cc /= n_chars
    dense = _concatenate((base, cc[:N_CLASSES], np.log1p(c), rates))
    return dense, keys, junk, has_alnum


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
    return Features(dense, buckets.astype(np.intp), junk)
