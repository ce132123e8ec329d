"""Text normalisation and the hashing primitives of the n-gram and word features.

The hashed features read the *normalised* sample: lower-cased (every script, `str.lower`), UTF-8,
digits folded to `0`, whitespace runs folded to one space, padded with a space on both sides. Hashes
are uint32 arithmetic (wrapping mod 2**32), deterministic across processes; a key lands in one of
`N_BUCKETS` buckets.

Words are runs of word bytes (ASCII letters, digits, `_`, any byte >= 128), except that a character
of three or four UTF-8 bytes other than U+1000..U+1FFF (CJK, kana, Hangul, Thai, Indic scripts,
symbols, emoji; `SPLIT_LEAD`) is a word of its own: scripts written without spaces then give
character unigrams and bigrams ("words" and "word bigrams"), the unit a lexicon can name in any
script, and a Chinese sentence has about as many "words" as its English translation has, not one.
U+1000..U+1FFF (lead byte 0xE1) is left joined: it holds the precomposed Vietnamese letters.
"""

from __future__ import annotations

import numpy as np

NGRAM_ORDERS = (3, 4, 5)
HASH_BITS = 17
N_BUCKETS = 1 << HASH_BITS

_U32 = np.uint32
FINAL = _U32(0x2545F491)
SHIFT = _U32(32 - HASH_BITS)
NGRAM_MULTS = [_U32(m) for m in (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1)]
BIGRAM_MULT = _U32(0x7FEB352D)
SALTS = {
    "char3": _U32(0x1B873593),
    "char4": _U32(0xCC9E2D51),
    "char5": _U32(0xE6546B64),
    "word": _U32(0x3C6EF372),
    "bigram": _U32(0xA54FF53A),
    "first": _U32(0x510E527F),
}

WORD_BYTES = np.zeros(256, dtype=np.int8)
WORD_BYTES[list(b"abcdefghijklmnopqrstuvwxyz0_")] = 1
WORD_BYTES[128:] = 1
# lead bytes of the 3- and 4-byte UTF-8 characters that are a word each (all but 0xE1, see above)
SPLIT_LEAD = np.zeros(256, dtype=bool)
SPLIT_LEAD[0xE0] = True
SPLIT_LEAD[0xE2:0xF5] = True
_rng = np.random.default_rng(0x5EC7)
# Per-byte and per-byte-pair random tables; non-word bytes contribute 0, so a word's hash is the sum
# of its bytes' and adjacent byte pairs' entries (order-sensitive through the pairs).
T1 = _rng.integers(1, 2**32, size=256, dtype=np.uint64).astype(np.uint32)
T1[WORD_BYTES == 0] = 0
T2 = _rng.integers(1, 2**32, size=(256, 256), dtype=np.uint64).astype(np.uint32)
T2[WORD_BYTES == 0, :] = 0
T2[:, WORD_BYTES == 0] = 0
T2[:, SPLIT_LEAD] = 0  # a split character starts a word: no pair links it to the byte before
T2 = T2.ravel()
del _rng
# Fast path: the contribution of byte i given the pair (x, y) = (byte i, byte i + 1) is T1[x] + T2[x, y]
# (the last byte of a normalised sample is a space, which contributes 0); indexed by the pair code
# x + 256 * y (see `byte_pairs`).
T12 = (T2.reshape(256, 256) + T1[:, None]).T.ravel()

# A-Z -> a-z and 0-9 -> 0, everything else unchanged (same length, whitespace kept).
LOWER_FOLD = bytes.maketrans(bytes(range(65, 91)) + b"0123456789", bytes(range(97, 123)) + b"0000000000")
ASCII_WS = b" \t\n\r\x0b\x0c"  # what bytes.split() splits on


def fold_ws(folded: bytes) -> bytes:
    return b" " + b" ".join(folded.split()) + b" "


# Non-ASCII marks folded before hashing: Spanish / Arabic question and quotation marks (which would
# otherwise glue to the next word), multiplication, division and minus signs, full-width operators
# and digits, Arabic-Indic digits. (pattern, replacement), grouped by the pattern's first byte.
_SYMBOLS: list[tuple[str, str]] = [
    ("\u00bf", " "),  # inverted question mark
    ("\u00a1", " "),  # inverted exclamation mark
    ("\u00ab", " "),  # guillemets
    ("\u00bb", " "),
    ("\u060c", " "),  # Arabic comma
    ("\u061b", " "),  # Arabic semicolon
    ("\u061f", " "),  # Arabic question mark
    ("\u00d7", "*"),  # multiplication sign
    ("\u00f7", "/"),  # division sign
    ("\u2212", "-"),  # minus sign
    ("\u2264", "<="),
    ("\u2265", ">="),
    ("\uff0b", "+"),  # full-width plus, minus, times, divide, equals
    ("\uff0d", "-"),
    ("\uff0a", "*"),
    ("\uff0f", "/"),
    ("\uff1d", "="),
    *[(chr(0xFF10 + d), "0") for d in range(10)],  # full-width digits
    *[(chr(0x0660 + d), "0") for d in range(10)],  # Arabic-Indic digits
    *[(chr(0x06F0 + d), "0") for d in range(10)],  # extended Arabic-Indic (Persian) digits
]
SYMBOL_FOLD: dict[int, list[tuple[bytes, bytes]]] = {}
for _a, _b in _SYMBOLS:
    _enc = _a.encode("utf-8")
    SYMBOL_FOLD.setdefault(_enc[0], []).append((_enc, _b.encode("ascii")))
SYMBOL_LEADS = [(bytes([lead]), pairs) for lead, pairs in sorted(SYMBOL_FOLD.items())]


def fold_symbols(buf: bytes) -> bytes:
    """`buf` (UTF-8) with the marks of `_SYMBOLS` replaced by their ASCII stand-ins."""
    for lead, pairs in SYMBOL_LEADS:
        if lead in buf:
            for pattern, repl in pairs:
                if pattern in buf:
                    buf = buf.replace(pattern, repl)
    return buf


def lowered_utf8(sample: str) -> bytes:
    """`sample` lower-cased in every script, as UTF-8, with `fold_symbols` applied (non-ASCII text);
    ASCII text is returned as is (`LOWER_FOLD` lower-cases it)."""
    if sample.isascii():
        return sample.encode("ascii")
    return fold_symbols(sample.lower().encode("utf-8", errors="surrogatepass"))


def normalise(sample: str) -> bytes:
    """Lower-cased UTF-8, digits folded to `0`, whitespace runs folded to one space, padded."""
    return fold_ws(lowered_utf8(sample).translate(LOWER_FOLD))


def byte_pairs(buf: bytes) -> np.ndarray:
    """Pair codes `buf[i] + 256 * buf[i + 1]` for every i (len(buf) >= 2), as intp.

    A zero-copy little-endian uint16 view with stride 1 reads every byte pair; one cast makes the
    table index array.
    """
    return np.ndarray((len(buf) - 1,), dtype="<u2", buffer=buf, strides=(1,)).astype(np.intp)


def word_hashes(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes uint32, start offsets) of the words in a normalised byte array (starts with a space)."""
    w = WORD_BYTES.take(arr)
    starts = np.flatnonzero((w[1:] > w[:-1]) | SPLIT_LEAD.take(arr[1:])) + 1
    if starts.size == 0:
        return np.zeros(0, dtype=np.uint32), starts
    a32 = arr.astype(np.intp)
    contrib = T1.take(a32)
    contrib[:-1] += T2.take(a32[:-1] * 256 + a32[1:])
    return np.add.reduceat(contrib, starts).astype(np.uint32), starts


def bigram_keys(words: np.ndarray) -> np.ndarray:
    return words[:-1] * BIGRAM_MULT + words[1:]
