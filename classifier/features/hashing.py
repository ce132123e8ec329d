"""Text normalisation and the hashing primitives of the n-gram and word features.

The hashed features read the *normalised* sample: UTF-8, ASCII lower-cased, digits folded to `0`,
whitespace runs folded to one space, padded with a space on both sides. Hashes are uint32 arithmetic
(wrapping mod 2**32), deterministic across processes; a key lands in one of `N_BUCKETS` buckets.
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
_rng = np.random.default_rng(0x5EC7)
# Per-byte and per-byte-pair random tables; non-word bytes contribute 0, so a word's hash is the sum
# of its bytes' and adjacent byte pairs' entries (order-sensitive through the pairs).
T1 = _rng.integers(1, 2**32, size=256, dtype=np.uint64).astype(np.uint32)
T1[WORD_BYTES == 0] = 0
T2 = _rng.integers(1, 2**32, size=(256, 256), dtype=np.uint64).astype(np.uint32)
T2[WORD_BYTES == 0, :] = 0
T2[:, WORD_BYTES == 0] = 0
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


def normalise(sample: str) -> bytes:
    """UTF-8, ASCII lower-cased, digits folded to `0`, whitespace runs folded to one space, padded."""
    return fold_ws(sample.encode("utf-8", errors="surrogatepass").translate(LOWER_FOLD))


def byte_pairs(buf: bytes) -> np.ndarray:
    """Pair codes `buf[i] + 256 * buf[i + 1]` for every i (len(buf) >= 2), as intp.

    A zero-copy little-endian uint16 view with stride 1 reads every byte pair; one cast makes the
    table index array.
    """
    return np.ndarray((len(buf) - 1,), dtype="<u2", buffer=buf, strides=(1,)).astype(np.intp)


def word_hashes(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes uint32, start offsets) of the words in a normalised byte array (starts with a space)."""
    w = WORD_BYTES.take(arr)
    starts = np.flatnonzero(w[1:] > w[:-1]) + 1
    if starts.size == 0:
        return np.zeros(0, dtype=np.uint32), starts
    a32 = arr.astype(np.intp)
    contrib = T1.take(a32)
    contrib[:-1] += T2.take(a32[:-1] * 256 + a32[1:])
    return np.add.reduceat(contrib, starts).astype(np.uint32), starts


def bigram_keys(words: np.ndarray) -> np.ndarray:
    return words[:-1] * BIGRAM_MULT + words[1:]
