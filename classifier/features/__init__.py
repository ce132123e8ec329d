"""Cheap text features for the request classifier.

Everything here is pure and deterministic, and costs a bounded amount of work per request:

* `request_text(messages)` picks the text to read (system prompt + the last user turns; a plain
  string for completions) and keeps only the head and tail of long inputs, so a 100 KB prompt costs
  about as much as a 4 KB one.
* `extract(sample, full_len)` returns `Features`: a dense vector of statistics (`DENSE_NAMES`: byte /
  character entropy, shares of character classes, line and word lengths, structural byte patterns,
  code / math / chat lexicon counts, in about the same units in every script) and the hashed bucket
  ids of the character 3/4/5-grams, words, word bigrams and first word of the lower-cased,
  digit-folded, whitespace-folded sample. A character of a script written without spaces (CJK, kana,
  Hangul, Thai) is a word of its own, and the marker lexicon has the cue words of the data's 13
  languages (and Japanese) in the same groups (`multilingual`): the evidence is the domain word, not
  the script.
* `scan(sample, full_len)` computes all of it in a fixed number of C-level passes (the classifier runs
  on every request); `extract` returns the dense vector in `DENSE_NAMES` order (training and tests use
  it), `scan` in `FAST_ORDER` (the loaded classifier permutes its weights once, so scoring needs no
  reordering).

One concern per module:

* `text`: the request text (`request_text`, head and tail of long inputs);
* `hashing`: normalisation (case and mark folding in every script) and the uint32 hashing
  primitives of words and n-grams;
* `lexicon`: the marker word / bigram groups and their hashed lookup table (`multilingual`: the
  groups' words in other languages);
* `dense`: what each dense statistic is (`DENSE_NAMES`, byte classes, pattern groups);
* `tables`: the fast path's lookup tables, derived from the three above;
* `fast`: `scan` and `extract`.

The reference formulation (one numpy expression per feature, the original implementation) lives in
`tests/classifier/reference_features.py`; the tests check that both give the same features.
"""

from __future__ import annotations

from classifier.features.dense import DENSE_NAMES, FAST_ORDER, N_DENSE, junk_share
from classifier.features.fast import Features, extract, scan
from classifier.features.hashing import HASH_BITS, N_BUCKETS, NGRAM_ORDERS, normalise
from classifier.features.text import (
    HEAD_CHARS,
    MAX_SAMPLE_CHARS,
    PART_CHARS,
    TAIL_CHARS,
    USER_TURNS,
    head_tail,
    request_text,
)

FEATURE_VERSION = 3

__all__ = [
    "DENSE_NAMES",
    "FAST_ORDER",
    "FEATURE_VERSION",
    "HASH_BITS",
    "HEAD_CHARS",
    "MAX_SAMPLE_CHARS",
    "NGRAM_ORDERS",
    "N_BUCKETS",
    "N_DENSE",
    "PART_CHARS",
    "TAIL_CHARS",
    "USER_TURNS",
    "Features",
    "extract",
    "head_tail",
    "junk_share",
    "normalise",
    "request_text",
    "scan",
]
