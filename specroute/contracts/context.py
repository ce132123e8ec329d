"""The request context the routing statistics are keyed by, and its back-off levels.

A context is a few cheap buckets of one request, computed by the gateway before it decides (no
tokenizer, no model): the classifier's domain, the writing script of the prompt, the sampling
temperature, the prompt's size and the constraint on its output (a JSON schema, tools). Its key
string travels to the worker in `GenerateRequest.context` and comes back in the feedback record, so
the learned statistics are per context (`specroute:stats:v2:ctx:{level}:{pool}`,
specroute/contracts/feedback.py).

Buckets (the format is versioned: changing a bucket means a new `CONTEXT_VERSION` and key prefix;
adding one whose default value is left out of the key, as `c`, does not):

- `d`: the domain (`chat`, `code`, `math`, ...), `[A-Za-z0-9_.-]`, at most 64 characters.
- `s`: script of the last non-empty prompt text (its first `SCRIPT_SAMPLE_CHARS` characters):
  `latin`, `cjk` (Han, kana, Hangul), `cyrillic`, `arabic` or `other` (Greek, Hebrew, Indic, ...),
  by the largest letter count, counted on UTF-8 lead bytes (CJK characters weigh `CJK_WEIGHT`: one
  carries about a word). All-ASCII text is `latin` at once; text without letters is `latin`.
- `t`: temperature: `0` (greedy, T < 1e-3), `low` (up to 0.8), `high` (above 0.8; also an absent
  temperature, the OpenAI default being 1).
- `l`: prompt size in UTF-8 bytes: `short` (< 1 KiB), `medium` (< 8 KiB), `long`.
- `c`: the constraint on the output: `none`, `json` (a `response_format` JSON object or schema) or
  `tools` (tools the model may call: a tool call is JSON, and a forced one is grammar-constrained).
  Constrained outputs accept differently from free text (a grammar masks the drafts), so they are
  learned apart; the gateway computes it at admission (router/api/structured.py `constraint`).

Key: `d=code|s=latin|t=0|l=short`, and `d=code|s=latin|t=0|l=short|c=json` under a constraint: `c`
is written only when it is not `none`, so every key from before the constraint existed is still the
key of the same (unconstrained) requests, and their statistics read on. Back-off levels, most
specific first (`level_keys`): the full context, the coarse context `d=code|t=0` (`d=code|t=0|c=json`;
temperature and constraint are what move acceptance most), the domain (`code`) and `GLOBAL_LEVEL`
(`*`, every request of the pool).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

CONTEXT_VERSION = 2
GLOBAL_LEVEL = "*"

SCRIPTS: tuple[str, ...] = ("latin", "cjk", "cyrillic", "arabic", "other")
TEMPERATURES: tuple[str, ...] = ("0", "low", "high")
LENGTHS: tuple[str, ...] = ("short", "medium", "long")
NO_CONSTRAINT, JSON_CONSTRAINT, TOOLS_CONSTRAINT = "none", "json", "tools"
CONSTRAINTS: tuple[str, ...] = (NO_CONSTRAINT, JSON_CONSTRAINT, TOOLS_CONSTRAINT)

DEFAULT_TEMPERATURE = 1.0   # OpenAI's, when a request names none
GREEDY_BELOW = 1e-3
LOW_TEMPERATURE_MAX = 0.8
SHORT_BYTES = 1024
MEDIUM_BYTES = 8192
SCRIPT_SAMPLE_CHARS = 512
CJK_WEIGHT = 3
MAX_CONTEXT_CHARS = 128

HOT, COOL = "hot", "cool"

_DOMAIN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# UTF-8 lead bytes (and ASCII letters) per script. Continuation bytes are 0x80-0xBF, so a lead byte
# counts one character; one `bytes.translate` maps every byte to its script's code and `bytes.count`
# counts each code, both single C-level passes (far cheaper than a regular expression per script).
_SCRIPT_BYTES: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("latin", ((0x41, 0x5A), (0x61, 0x7A), (0xC3, 0xC9))),  # A-Z a-z, U+00C0-U+027F
    ("cjk", ((0xE3, 0xED),)),  # U+3000-U+DFFF: kana, CJK ideographs, Hangul syllables
    ("cyrillic", ((0xD0, 0xD3),)),  # U+0400-U+04FF
    ("arabic", ((0xD8, 0xDB), (0xDD, 0xDD))),  # U+0600-U+06FF, U+0740-U+077F
    ("other", ((0xCD, 0xCF), (0xD4, 0xD7), (0xE0, 0xE1))),  # Greek, Armenian, Hebrew, Indic, ...
)


def _code_table() -> bytes:
    table = bytearray(256)
    for code, (_name, ranges) in enumerate(_SCRIPT_BYTES, start=1):
        for lo, hi in ranges:
            table[lo:hi + 1] = bytes([code]) * (hi - lo + 1)
    return bytes(table)


_CODES = _code_table()
_WEIGHTS = tuple((name, bytes([code]), CJK_WEIGHT if name == "cjk" else 1)
                 for code, (name, _r) in enumerate(_SCRIPT_BYTES, start=1))


def script_of(text: str) -> str:
    """The script bucket of `text` (its first `SCRIPT_SAMPLE_CHARS` characters)."""
    sample = text[:SCRIPT_SAMPLE_CHARS]
    if sample.isascii():
        return "latin"
    codes = sample.encode("utf-8", "surrogatepass").translate(_CODES)
    best, best_n = "latin", 0
    for name, code, weight in _WEIGHTS:
        n = codes.count(code) * weight
        if n > best_n:
            best, best_n = name, n
    return best


def script_of_texts(texts: Sequence[str]) -> str:
    """The script of the last non-empty text (the question, in a chat)."""
    for t in reversed(texts):
        if t:
            return script_of(t)
    return "latin"


def temperature_bucket(temperature: float | None) -> str:
    """The one rule: `0` below `GREEDY_BELOW`, `low` up to `LOW_TEMPERATURE_MAX`, else `high`."""
    t = DEFAULT_TEMPERATURE if temperature is None else float(temperature)
    if t < GREEDY_BELOW:
        return "0"
    return "low" if t <= LOW_TEMPERATURE_MAX else "high"


def length_bucket(prompt_bytes: int) -> str:
    if prompt_bytes < SHORT_BYTES:
        return "short"
    return "medium" if prompt_bytes < MEDIUM_BYTES else "long"


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Buckets of one request; `domain` is empty until the policy has chosen it (`with_domain`)."""

    domain: str = ""
    script: str = "latin"
    temperature: str = "high"
    length: str = "short"
    constraint: str = NO_CONSTRAINT

    def with_domain(self, domain: str) -> RequestContext:
        return RequestContext(domain, self.script, self.temperature, self.length, self.constraint)

    @property
    def batch(self) -> str:
        """The batch kind a worker choice groups rows by (router/routing/affinity.py): `hot` at the
        `high` temperature bucket, where drafting rarely pays, else `cool`."""
        return HOT if self.temperature == "high" else COOL

    @property
    def _constraint_part(self) -> str:
        return "" if self.constraint == NO_CONSTRAINT else f"|c={self.constraint}"

    @property
    def key(self) -> str:
        """`d=..|s=..|t=..|l=..[|c=..]` ("" without a domain; `c` only under a constraint)."""
        if not self.domain:
            return ""
        return f"d={self.domain}|s={self.script}|t={self.temperature}|l={self.length}{self._constraint_part}"

    @property
    def coarse_key(self) -> str:
        """`d=..|t=..[|c=..]` ("" without a domain)."""
        return f"d={self.domain}|t={self.temperature}{self._constraint_part}" if self.domain else ""


def request_context(texts: Sequence[str], temperature: float | None, prompt_bytes: int,
                    constraint: str = NO_CONSTRAINT) -> RequestContext:
    """The context of a request (domain left empty for the policy to fill in); `constraint` is one of
    `CONSTRAINTS` (anything else counts as `none`)."""
    return RequestContext("", script_of_texts(texts), temperature_bucket(temperature), length_bucket(prompt_bytes),
                          constraint if constraint in CONSTRAINTS else NO_CONSTRAINT)


def parse_context(key: str) -> RequestContext | None:
    """The full context of a key string, or None when it is not a valid full context key (one
    without `c` is unconstrained)."""
    if not key or len(key) > MAX_CONTEXT_CHARS:
        return None
    parts = key.split("|")
    if len(parts) not in (4, 5):
        return None
    vals: list[str] = []
    for part, name in zip(parts, ("d", "s", "t", "l", "c"), strict=False):
        k, sep, v = part.partition("=")
        if k != name or not sep:
            return None
        vals.append(v)
    d, s, t, ln = vals[:4]
    c = vals[4] if len(vals) == 5 else NO_CONSTRAINT
    if not _DOMAIN.fullmatch(d) or s not in SCRIPTS or t not in TEMPERATURES or ln not in LENGTHS \
            or c not in CONSTRAINTS:
        return None
    return RequestContext(d, s, t, ln, c)


def domain_level(domain: str) -> str:
    """A record's domain as a statistics level: itself when a valid domain name, else `unknown`."""
    return domain if _DOMAIN.fullmatch(domain or "") else "unknown"


def level_keys(domain: str, context: RequestContext | None) -> tuple[str, ...]:
    """Statistics levels of a request, most specific first: full context, coarse context, domain,
    global (the context levels only when `context` carries this domain)."""
    if context is None or context.domain != domain or not domain:
        return (domain, GLOBAL_LEVEL)
    return (context.key, context.coarse_key, domain, GLOBAL_LEVEL)


def context_keys_for(context: str, domain: str) -> tuple[str, ...]:
    """The context cells a feedback record updates: its full and coarse context, or none when the
    context is missing, malformed or of another domain (a record is never trusted to name keys)."""
    ctx = parse_context(context)
    if ctx is None or ctx.domain != domain:
        return ()
    return (ctx.key, ctx.coarse_key)
