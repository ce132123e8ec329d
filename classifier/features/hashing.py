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
SPLIT_LEN = np.zeros(256, dtype=np.intp)  # the UTF-8 length of a split character, by lead byte
SPLIT_LEN[SPLIT_LEAD] = 3
SPLIT_LEN[0xF0:0xF5] = 4
# ASCII word bytes: one right after a split character starts a word too ("共3个", "用python写")
ASCII_WORD = np.zeros(256, dtype=bool)
ASCII_WORD[list(b"abcdefghijklmnopqrstuvwxyz0_")] = True
_rng = np.random.default_rng(0x5EC7)
# Per-byte and per-byte-pair random tables; non-word bytes contribute 0, so a word's hash is the sum
# of its bytes' and adjacent byte pairs' entries (order-sensitive through the pairs).
T1 = _rng.integers(1, 2**32, size=256, dtype=np.uint64).astype(np.uint32)
T1[WORD_BYTES == 0] = 0
T2 = _rng.integers(1, 2**32, size=(256, 256), dtype=np.uint64).astype(np.uint32)
T2[WORD_BYTES == 0, :] = 0
T2[:, WORD_BYTES == 0] = 0
T2[:, SPLIT_LEAD] = 0  # a split character starts a word: no pair links it to the byte before
T2[0x80:0xC0, ASCII_WORD] = 0  # ... nor the ASCII word after it (a continuation byte, then ASCII)
T2 = T2.ravel()
del _rng
# Fast path: the contribution of byte i given the pair (x, y) = (byte i, byte i + 1) is T1[x] + T2[x, y]
# (the last byte of a normalised sample is a space, which contributes 0); indexed by the pair code
# x + 256 * y (see `byte_pairs`).
T12 = (T2.reshape(256, 256) + T1[:, None]).T.ravel()

_ndarray = np.ndarray
_PAIR_DTYPE = np.dtype("<u2")  # (dtype objects and positional arguments: `byte_pairs` runs per request)
_STRIDE_1 = (1,)
_INTP = np.dtype(np.intp)
_BOOL = np.dtype(bool)

# A-Z -> a-z and 0-9 -> 0, everything else unchanged (same length, whitespace kept).
LOWER_FOLD = bytes.maketrans(bytes(range(65, 91)) + b"0123456789", bytes(range(97, 123)) + b"0000000000")
ASCII_WS = b" \t\n\r\x0b\x0c"  # what bytes.split() splits on
# `LOWER_FOLD`, and every byte of `ASCII_WS` to a space: a text without two spaces in a row is then
# already whitespace-folded, up to one space at either end (`fold_ws` without the split and join).
LOWER_FOLD_WS = bytes(32 if b in ASCII_WS else LOWER_FOLD[b] for b in range(256))


def fold_ws(folded: bytes) -> bytes:
    return b" " + b" ".join(folded.split()) + b" "


def fold_spaces(folded: bytes) -> bytes:
    """`fold_ws` of a text whose whitespace bytes are all spaces already (`LOWER_FOLD_WS`): without a run
    of two spaces it only needs its ends trimmed, no split and join (most prompts have no such run)."""
    if b"  " in folded:
        return b" " + b" ".join(folded.split()) + b" "
    return b" " + folded.strip(b" ") + b" "


# Non-ASCII marks and their ASCII stand-ins. In the character-class shares every one counts as its
# stand-in as well (a question is a question in every script: Arabic and CJK question marks, CJK
# commas and full stops, full-width operators and digits); see `dense.SYMBOL_IDS`.
SYMBOLS: dict[str, str] = {
    "\u00bf": "?",  # inverted question and exclamation marks
    "\u00a1": "!",
    "\u00ab": '"',  # guillemets
    "\u00bb": '"',
    "\u060c": ",",  # Arabic comma, semicolon, question mark
    "\u061b": ";",
    "\u061f": "?",
    "\u00d7": "*",  # multiplication and division signs
    "\u00f7": "/",
    "\u2212": "-",  # minus sign, less / greater or equal
    "\u2264": "<",
    "\u2265": ">",
    "\u3002": ".",  # ideographic full stop and comma
    "\u3001": ",",
    "\uff0c": ",",  # full-width punctuation and operators
    "\uff1f": "?",
    "\uff01": "!",
    "\uff1a": ":",
    "\uff1b": ";",
    "\uff08": "(",
    "\uff09": ")",
    "\uff0b": "+",
    "\uff0d": "-",
    "\uff0a": "*",
    "\uff0f": "/",
    "\uff1d": "=",
    **{chr(0xFF10 + d): "0" for d in range(10)},  # full-width digits
    **{chr(0x0660 + d): "0" for d in range(10)},  # Arabic-Indic digits
    **{chr(0x06F0 + d): "0" for d in range(10)},  # extended Arabic-Indic (Persian) digits
}

# The hashed text maps two-byte characters to two-byte replacements before `LOWER_FOLD` (a few table
# lookups over the byte pairs, `CharFold`, not a Python pass over characters):
# * letters of Latin-1, Latin Extended-A/B, Greek and Cyrillic to lower case ("Как" and "как" are one
#   word; ASCII is lower-cased by `LOWER_FOLD`);
# * the two-byte marks of `SYMBOLS` to ASCII: Spanish inverted marks and guillemets to spaces (they
#   would glue to the next word), Arabic punctuation to its ASCII stand-in and a space (it would
#   glue to the word before), multiplication / division signs to `*` / `/` and a space ("12 × 7" is
#   an equation), Arabic-Indic digits to `00` (every digit folds to zeros; a number stays one word).
# Characters of three bytes or more are left as they are: CJK punctuation is a word of its own
# anyway (`SPLIT_LEAD`), and upper-case Vietnamese letters with two diacritics stay upper case.


def _fold_two_byte() -> dict[str, str]:
    out: dict[str, str] = {}
    for lo, hi in ((0x00C0, 0x0250), (0x0370, 0x0530)):
        for cp in range(lo, hi):
            ch = chr(cp)
            low = ch.lower()
            if low != ch and len(low) == 1 and len(low.encode("utf-8")) == 2:
                out[ch] = low
    for ch, stand_in in SYMBOLS.items():
        if len(ch.encode("utf-8")) != 2:
            continue
        if stand_in == "0":
            out[ch] = "00"
        elif stand_in in '?!"' and ch in "\u00bf\u00a1\u00ab\u00bb":
            out[ch] = "  "
        else:
            out[ch] = stand_in + " "
    return out


FOLD: dict[str, str] = _fold_two_byte()


class CharFold:
    """`FOLD` applied to UTF-8 bytes: the pair of a two-byte lead (0xC2-0xDF) and the next byte always
    starts a character, so the replacements are one table lookup over the byte pairs."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.two = np.zeros(1 << 16, dtype=np.uint16)  # pair code -> replacement pair code
        leads = np.zeros(256, dtype=bool)
        for ch, repl in mapping.items():
            src, dst = ch.encode("utf-8"), repl.encode("utf-8")
            if not (len(src) == len(dst) == 2 and 0xC2 <= src[0] <= 0xDF):
                raise ValueError(f"cannot map {ch!r} to {repl!r}")
            self.two[src[0] + 256 * src[1]] = dst[0] + 256 * dst[1]
            leads[src[0]] = True
        self.leads = np.flatnonzero(leads)

    def apply(self, raw: bytes, pairs: np.ndarray, counts: np.ndarray) -> bytes:
        """`raw` (UTF-8, two bytes or more) mapped; `pairs` its `byte_pairs`, `counts` its byte
        histogram (no lead byte of a mapped character: `raw` itself)."""
        if not counts.take(self.leads).any():
            return raw
        return self.fold(raw, pairs)

    def fold(self, raw: bytes, pairs: np.ndarray) -> bytes:
        """`apply` without the check: for a caller that knows `raw` has a lead byte of `self.leads`."""
        r = self.two.take(pairs)
        out = bytearray(raw)
        # replacement pairs written through a stride-1 uint16 view: mapped characters never overlap
        view = _ndarray((len(raw) - 1,), _PAIR_DTYPE, out, 0, _STRIDE_1)
        np.copyto(view, r, where=r.astype(_BOOL))
        return bytes(out)


CHAR_FOLD = CharFold(FOLD)


def lowered_utf8(sample: str) -> bytes:
    """`sample` as UTF-8 with `FOLD` applied (ASCII is lower-cased later, by `LOWER_FOLD`)."""
    raw = sample.encode("utf-8", errors="surrogatepass")
    if len(raw) == len(sample) or len(raw) < 2:
        return raw
    counts = np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
    return CHAR_FOLD.apply(raw, byte_pairs(raw), counts)


def normalise(sample: str) -> bytes:
    """Lower-cased UTF-8, digits folded to `0`, whitespace runs folded to one space, padded."""
    return fold_ws(lowered_utf8(sample).translate(LOWER_FOLD))


def byte_pairs(buf: bytes) -> np.ndarray:
    """Pair codes `buf[i] + 256 * buf[i + 1]` for every i (len(buf) >= 2), as intp.

    A zero-copy little-endian uint16 view with stride 1 reads every byte pair; one cast makes the
    table index array.
    """
    return _ndarray((len(buf) - 1,), _PAIR_DTYPE, buf, 0, _STRIDE_1).astype(_INTP)


def word_hashes(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes uint32, start offsets) of the words in a normalised byte array (starts with a space)."""
    w = WORD_BYTES.take(arr)
    start = np.zeros(arr.size, dtype=bool)
    start[1:] = (w[1:] > w[:-1]) | SPLIT_LEAD.take(arr[1:])
    after = np.flatnonzero(SPLIT_LEN.take(arr))
    after = after + SPLIT_LEN.take(arr[after])
    after = after[after < arr.size]
    start[after[ASCII_WORD.take(arr[after])]] = True
    starts = np.flatnonzero(start)
    if starts.size == 0:
        return np.zeros(0, dtype=np.uint32), starts
    a32 = arr.astype(np.intp)
    contrib = T1.take(a32)
    contrib[:-1] += T2.take(a32[:-1] * 256 + a32[1:])
    return np.add.reduceat(contrib, starts).astype(np.uint32), starts


def bigram_keys(words: np.ndarray) -> np.ndarray:
    return words[:-1] * BIGRAM_MULT + words[1:]
