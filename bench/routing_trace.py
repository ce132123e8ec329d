"""Traces of `specroute bench routing` (pure: prompts in, a seeded request list out).

Prompts come from the held-out split (`specroute.contracts.split.is_heldout`, 10% of every source by
a hash of the item id): the target, the drafters and the classifier's final model were all trained
without them (`specroute classifier train` leaves them out of its final fit), in every language.
Warm-up requests draw from the same held-out pool but never reuse a measured prompt.

Scenarios (`SCENARIOS`): a request count (`requests_factor` x the run's `--requests-per-scenario`:
S3 and S4 run twice as many, so that as many follow their change as a plain scenario has) and a list
of phases, each with a domain mix, a temperature mix, a language mix
and a concurrency (None: the run's `--concurrency`); a phase boundary is where S3 drifts, S4's drafter
goes bad and S5's load surges.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

DOMAINS = ("chat", "code", "math")
MAX_PROMPT_CHARS = 1500   # a prompt plus max_tokens must fit the demo model's 1024-token context


@dataclass(frozen=True)
class Prompt:
    id: str
    domain: str
    lang: str      # ISO 639-1, "en" when the record has no `lang`
    text: str


@dataclass(frozen=True)
class Phase:
    share: float                           # of the scenario's requests
    domains: Mapping[str, float]           # domain -> weight
    temperatures: Mapping[float, float]    # temperature -> weight
    non_english: float = 0.0               # share of non-English prompts
    concurrency: int | None = None         # None: the run's --concurrency


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    phases: tuple[Phase, ...]
    fault_at_phase: int | None = None      # S4: the DFly drafter goes bad when this phase starts
    requests_factor: float = 1.0           # x --requests-per-scenario (S3, S4: room after the change)


CODE_MATH = {"code": 0.4, "math": 0.4, "chat": 0.2}
CHAT_HEAVY = {"chat": 0.8, "code": 0.1, "math": 0.1}
EVEN = {d: 1.0 for d in DOMAINS}
T0 = {0.0: 1.0}
API_TEMPS = {0.0: 1.0, 0.7: 1.0, 1.0: 1.0}

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("S1", "code and math heavy (80%), T=0", (Phase(1.0, CODE_MATH, T0),)),
    Scenario("S2", "chat heavy (80%), T in {0, 0.7, 1}", (Phase(1.0, CHAT_HEAVY, API_TEMPS),)),
    Scenario("S3", "drift: S1 then S2", (Phase(0.5, CODE_MATH, T0), Phase(0.5, CHAT_HEAVY, API_TEMPS)),
             requests_factor=2.0),
    Scenario("S4", "DFly drafter goes bad mid-run (S1 traffic)", (Phase(0.5, CODE_MATH, T0), Phase(0.5, CODE_MATH, T0)),
             fault_at_phase=1, requests_factor=2.0),
    Scenario("S5", "load surge: concurrency 2, 16, 2 (even mix, T=0)",
             (Phase(0.2, EVEN, T0, concurrency=2), Phase(0.6, EVEN, T0, concurrency=16),
              Phase(0.2, EVEN, T0, concurrency=2))),
    Scenario("S6", "multilingual: half non-English, even mix, T=0", (Phase(1.0, EVEN, T0, non_english=0.5),)),
)}


@dataclass(frozen=True)
class TraceItem:
    index: int          # dispatch order within the cell
    phase: int
    prompt_id: str
    domain: str         # the data's label (the gateway classifies on its own)
    lang: str
    temperature: float
    concurrency: int
    text: str

    def row(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("text")
        return d


def read_prompts(root: Path, max_chars: int = MAX_PROMPT_CHARS) -> list[Prompt]:
    """Held-out prompts of `root/prompts/*.jsonl` (string prompts of at most `max_chars`), sorted by id."""
    from specroute.contracts.split import is_heldout

    out: list[Prompt] = []
    for path in sorted((root / "prompts").glob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                r = json.loads(line)
                text = r.get("prompt")
                if (isinstance(text, str) and text.strip() and len(text) <= max_chars
                        and r.get("domain") in DOMAINS and is_heldout(str(r["id"]))):
                    out.append(Prompt(str(r["id"]), r["domain"], str(r.get("lang") or "en"), text))
    return sorted(out, key=lambda p: p.id)


class PromptPool:
    """Held-out prompts by (domain, English?), drawn without replacement in a seeded order (wrapping
    around when a bucket runs out); `reserve(n)` sets aside the first prompts of each bucket for warm-up."""

    def __init__(self, prompts: Iterable[Prompt], seed: int) -> None:
        self.buckets: dict[tuple[str, bool], list[Prompt]] = {}
        for p in prompts:
            self.buckets.setdefault((p.domain, p.lang != "en"), []).append(p)
        rng = random.Random(seed)
        for ps in self.buckets.values():
            rng.shuffle(ps)
        self.pos = dict.fromkeys(self.buckets, 0)

    def has(self, domain: str, non_english: bool) -> bool:
        return bool(self.buckets.get((domain, non_english)))

    def take(self, domain: str, non_english: bool) -> Prompt:
        key = (domain, non_english)
        if not self.has(*key):
            key = (domain, not non_english)   # no item of that language for the domain: the other one
        ps = self.buckets[key]
        p = ps[self.pos[key] % len(ps)]
        self.pos[key] += 1
        return p


def _pick(rng: random.Random, weights: Mapping[object, float]) -> object:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys], k=1)[0]


def phase_sizes(scenario: Scenario, n: int) -> list[int]:
    """Requests per phase (largest remainder; every phase at least one)."""
    raw = [ph.share * n for ph in scenario.phases]
    sizes = [max(1, int(r)) for r in raw]
    while sum(sizes) < n:
        i = max(range(len(raw)), key=lambda j: raw[j] - sizes[j])
        sizes[i] += 1
    while sum(sizes) > n and max(sizes) > 1:
        sizes[sizes.index(max(sizes))] -= 1
    return sizes


def build_trace(scenario: Scenario, n: int, concurrency: int, pool: PromptPool, seed: int,
                phase: int | None = None) -> list[TraceItem]:
    """`n` requests of `scenario` (or, with `phase`, `n` requests of that phase alone: warm-up)."""
    rng = random.Random(f"{seed}:{scenario.name}:{phase}")
    plan = [(phase, n)] if phase is not None else list(enumerate(phase_sizes(scenario, n)))
    out: list[TraceItem] = []
    for ph_i, size in plan:
        assert ph_i is not None
        ph = scenario.phases[ph_i]
        for _ in range(size):
            domain = str(_pick(rng, ph.domains))
            non_en = rng.random() < ph.non_english
            temp = float(_pick(rng, ph.temperatures))  # type: ignore[arg-type]
            p = pool.take(domain, non_en)
            out.append(TraceItem(len(out), ph_i, p.id, p.domain, p.lang, temp, ph.concurrency or concurrency, p.text))
    return out


def segments(trace: Sequence[TraceItem]) -> list[list[TraceItem]]:
    """Consecutive items of the same phase: each runs as one closed loop at its concurrency."""
    out: list[list[TraceItem]] = []
    for it in trace:
        if out and out[-1][-1].phase == it.phase:
            out[-1].append(it)
        else:
            out.append([it])
    return out
