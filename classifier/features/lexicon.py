"""The marker lexicon: word and word-bigram groups pooled into counts (evidence that generalises
across sources), and the hashed table that finds them.

`MARKER_TABLE[slot]` has bit g set when a phrase of group `MARKER_GROUPS[g]` hashes to the slot; a
word or bigram key `k` is looked up at `((k ^ MARKER_SALT) * FINAL) >> MARKER_SHIFT`.
"""

from __future__ import annotations

import numpy as np

from classifier.features.hashing import FINAL, bigram_keys, normalise, word_hashes
from classifier.features.multilingual import MULTILINGUAL

_MARKER_TABLE_BITS = 20
MARKER_SHIFT = np.uint32(32 - _MARKER_TABLE_BITS)
MARKER_SALT = np.uint32(0x5BE0CD19)


def _keys_of(phrase: str) -> list[int]:
    """The word key (one word) or bigram keys (two or three words) of a phrase, as the sample path
    computes them. Three "words" are the two character bigrams of a three-character word of a script
    written without spaces (see `classifier.features.hashing`)."""
    arr = np.frombuffer(normalise(phrase), dtype=np.uint8)
    words, _ = word_hashes(arr)
    if words.size == 1:
        return [int(words[0])]
    if words.size in (2, 3):
        return [int(k) for k in bigram_keys(words)]
    raise ValueError(f"marker phrase must have one to three words: {phrase!r}")


# Word / bigram marker groups (pooled evidence that generalises across sources).
WORD_GROUPS: dict[str, str] = {
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
BIGRAM_GROUPS: dict[str, list[str]] = {
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


def group_phrases(name: str) -> list[str]:
    """Every phrase of a marker group: the English ones, then those of `MULTILINGUAL`."""
    english = WORD_GROUPS[name].split() if name in WORD_GROUPS else list(BIGRAM_GROUPS[name])
    other = [
        p.strip() for lang in sorted(MULTILINGUAL.get(name, {})) for p in MULTILINGUAL[name][lang].split("|")
    ]
    return english + [p for p in other if p]


def _build_marker_table() -> tuple[np.ndarray, list[str]]:
    names = list(WORD_GROUPS) + list(BIGRAM_GROUPS)
    assert set(MULTILINGUAL) <= set(names), set(MULTILINGUAL) - set(names)
    table = np.zeros(1 << _MARKER_TABLE_BITS, dtype=np.uint16)
    for bit, name in enumerate(names):
        for phrase in group_phrases(name):
            keys = np.array(_keys_of(phrase), dtype=np.uint32)
            slots = ((keys ^ MARKER_SALT) * FINAL >> MARKER_SHIFT).astype(np.intp)
            table[slots] |= np.uint16(1 << bit)
    return table, names


# `MARKER_TABLE[slot]`: bit g set if a phrase of marker group g hashes to the slot.
MARKER_TABLE, MARKER_GROUPS = _build_marker_table()
