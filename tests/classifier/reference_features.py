"""The reference formulation of `classifier.features.extract`: one numpy expression per feature.

This is the specification (FEATURE_VERSION 3) the fast path in `classifier.features.fast.scan` must
reproduce: same dense vector (up to float rounding) and the same multiset of bucket ids. It shares
only the constant tables, the lexicons and the word hashing primitives with the package.
"""

from __future__ import annotations

import math

import numpy as np

from classifier import features as F
from classifier.features import dense as D
from classifier.features import hashing as H
from classifier.features import lexicon as LX

_IS_LOWER_ORIG = np.zeros(256, dtype=bool)
_IS_LOWER_ORIG[97:123] = True
_IS_UPPER_ORIG = np.zeros(256, dtype=bool)
_IS_UPPER_ORIG[65:91] = True
_MARKER_BITS = np.array([1 << i for i in range(len(LX.MARKER_GROUPS))], dtype=np.uint16)


def extract(sample: str, full_len: int | None = None) -> F.Features:
    if full_len is None:
        full_len = len(sample)
    dense = np.zeros(F.N_DENSE, dtype=np.float64)
    n_chars = len(sample)
    dense[0] = math.log1p(full_len)
    dense[1] = math.log1p(n_chars)
    if n_chars == 0 or sample.isspace():
        return F.Features(dense, np.zeros(0, dtype=np.intp), 0.0)

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
    byte_h = D.entropy_bits(counts, n_bytes)
    dense[8] = byte_h / 8.0
    if n_bytes == n_chars:
        char_h = byte_h
    else:
        cps = np.frombuffer(sample.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        char_h = D.entropy_bits(np.bincount(cps % D.CHAR_BINS, minlength=D.CHAR_BINS), n_chars)
    dense[9] = char_h / 8.0
    dense[10] = char_h / math.log2(n_chars + 1)
    k = 11
    class_counts = counts @ D.CLASS_MATRIX
    n_control = int(class_counts[-1])
    # a non-ASCII mark (Arabic / CJK question marks, commas, x...) counts as its ASCII stand-in too
    for ch in sample:
        if ch in H.SYMBOLS:
            class_counts += D.CLASS_MATRIX[ord(H.SYMBOLS[ch])]
    class_counts[D.CLASS_NAMES.index("non_ascii")] = sum(1 for ch in sample if ord(ch) >= 128)
    shares = class_counts / n_chars  # per character
    dense[k : k + len(D.CLASS_NAMES)] = shares
    k += len(D.CLASS_NAMES)
    junk = F.junk_share(sample, n_control)
    dense[k] = junk

    # character by character: the specification of `hashing.CHAR_FOLD`
    folded = "".join(H.FOLD.get(ch, ch) for ch in sample).encode("utf-8", errors="surrogatepass")
    folded = folded.translate(H.LOWER_FOLD)
    norm = H.fold_ws(folded)
    a = np.frombuffer(norm, dtype=np.uint8)
    words, starts = H.word_hashes(a)
    n_words = words.size
    dense[6] = math.log1p(n_words)
    dense[7] = math.log1p(n_chars / n_words) if n_words else 0.0

    c = np.zeros(len(D.COUNT_NAMES), dtype=np.float64)
    fa = np.frombuffer(raw.translate(H.LOWER_FOLD), dtype=np.uint8).astype(np.intp)  # raw pairs
    if fa.size >= 2:
        groups = D.PAIR_TABLE.take(fa[:-1] * 256 + fa[1:])
        c[: D.N_PAIR_GROUPS - 1] = np.bincount(groups, minlength=D.N_PAIR_GROUPS)[1:]
    j = D.N_PAIR_GROUPS - 1
    c[j] = len(D.TAG_RE.findall(sample)) if "<" in sample else 0
    c[j + 1] = len(D.LATEX_CMD_RE.findall(sample)) if "\\" in sample else 0
    dense_ops = np.frombuffer(norm.replace(b" ", b""), dtype=np.uint8)
    if dense_ops.size >= 3:
        d = D.IS_DIGIT.take(dense_ops)
        o = D.IS_OP.take(dense_ops)
        al = D.IS_ALNUM.take(dense_ops)
        c[j + 2] = np.count_nonzero(d[:-2] & o[1:-1] & d[2:])
        c[j + 3] = np.count_nonzero(al[:-2] & (dense_ops[1:-1] == 61) & (d[2:] | (dense_ops[2:] == 40)))
    w_bytes = H.WORD_BYTES.take(a).astype(bool)
    c[j + 4] = np.count_nonzero(w_bytes[:-1] & (a[1:] == 40))
    c[j + 5] = np.count_nonzero(w_bytes[:-2] & (a[1:-1] == 46) & w_bytes[2:])
    c[j + 6] = np.count_nonzero(D.IS_ALNUM.take(a[:-2]) & (a[1:-1] == 95) & D.IS_ALNUM.take(a[2:]))
    c[j + 7] = np.count_nonzero(_IS_LOWER_ORIG.take(arr[:-1]) & _IS_UPPER_ORIG.take(arr[1:]))
    c[j + 8] = np.count_nonzero(a.take(starts) == 48) if n_words else 0
    c[j + 9] = counts[36] // 2
    j = len(D.STRUCT_NAMES)

    bigrams = H.bigram_keys(words) if n_words > 1 else np.zeros(0, dtype=np.uint32)
    keys = np.concatenate((words, bigrams))
    if keys.size:
        slots = ((keys ^ LX.MARKER_SALT) * H.FINAL) >> LX.MARKER_SHIFT
        hits = LX.MARKER_TABLE.take(slots.astype(np.intp))
        hits = hits[hits != 0]
        if hits.size:
            c[j:] = ((hits[:, None] & _MARKER_BITS) != 0).sum(axis=0)
    n_counts = len(D.COUNT_NAMES)
    k = D.N_BASE
    dense[k : k + n_counts] = np.log1p(c)
    dense[k + n_counts : k + 2 * n_counts] = np.log1p(c * (D.RATE_WORDS / (n_words + D.RATE_WORDS)))

    parts = []
    n = a.size
    if n >= 3:
        a32 = a.astype(np.uint32)
        mults = H.NGRAM_MULTS
        h = a32[:-2] * mults[0] + a32[1:-1] * mults[1] + a32[2:] * mults[2]
        parts.append(h ^ H.SALTS["char3"])
        if n >= 4:
            h = h[:-1] + a32[3:] * mults[3]
            parts.append(h ^ H.SALTS["char4"])
            if n >= 5:
                h = h[:-1] + a32[4:] * mults[4]
                parts.append(h ^ H.SALTS["char5"])
    if n_words:
        parts.append(words ^ H.SALTS["word"])
        parts.append(words[:1] ^ H.SALTS["first"])
        if n_words > 1:
            parts.append(bigrams ^ H.SALTS["bigram"])
    if parts:
        buckets = ((np.concatenate(parts) * H.FINAL) >> H.SHIFT).astype(np.intp)
    else:
        buckets = np.zeros(0, dtype=np.intp)
    return F.Features(dense, buckets, junk)
