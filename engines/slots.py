"""Per-slot request state of a `SpecDecoder`: the request's sampling settings and generator, its
mode's drafter (and the other drafters it may switch to step by step), its prefill progress and last
emitted token, its acceptance record, and, per drafter, the target features of committed positions
that drafter has not seen yet; and `backlog_groups`, how a drafter call splits its rows by how much of
that they bring."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from engines.drafters.base import Drafter
from engines.grammar import Constraint
from engines.logprobs import TokenLogprob
from engines.sampling import SamplingParams
from specroute.contracts.context import temperature_bucket
from specroute.contracts.stats import AcceptanceStats


@dataclass
class Pending:
    """Target features of committed positions the drafter has not seen yet (tensors are built only
    when the drafter takes them: plain steps, which D-Cut may run for a long time, stay cheap)."""
    feats: list[Tensor] = field(default_factory=list)        # each [t, F]
    starts: list[int] = field(default_factory=list)          # first position of each chunk
    next_tokens: list[int] = field(default_factory=list)     # committed token after each position

    def append(self, feats: Tensor, start: int, next_tokens: Sequence[int]) -> None:
        self.feats.append(feats)
        self.starts.append(start)
        self.next_tokens.extend(next_tokens)

    def take(self) -> tuple[Tensor, Tensor, Tensor] | None:
        if not self.feats:
            return None
        positions = torch.cat([torch.arange(s, s + f.shape[0]) for s, f in zip(self.starts, self.feats, strict=True)])
        out = torch.cat(self.feats), positions, torch.tensor(self.next_tokens, dtype=torch.long)
        self.feats, self.starts, self.next_tokens = [], [], []
        return out


@dataclass
class SlotState:
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    prefilled: int = 0              # prompt tokens already in the cache
    y0: int | None = None           # last emitted token (not yet fed); None while prefilling
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)   # drafted = kept drafts, per step
    mode: str = ""                  # the engine mode (key of SpecDecoder.modes) this request runs in
    domain: str = ""                # the request's domain as the router labelled it ("": unknown)
    drafter: Drafter | None = None  # that mode's drafter (None: plain decoding)
    # every drafter that may draft for this row (the mode's first; on a multi-mode decoder a speculative
    # row may draft with another mode's drafter in a busy step), each with its unseen context
    drafters: tuple[Drafter, ...] = ()
    pending: dict[int, Pending] = field(default_factory=dict)   # id(drafter) -> what it has not seen
    records: dict[int, tuple[int, int]] = field(default_factory=dict)   # id(drafter) -> (steps, tokens) it drafted
    last_drafter: Drafter | None = None     # who drafted the row's proposal being verified
    constraint: Constraint | None = None   # the grammar its output must match (`engines.grammar`)
    bucket: str = ""                # temperature bucket ("0", "low", "high"); "" = from `params` once
    logprobs: list[TokenLogprob] = field(default_factory=list)   # emitted, not yet taken (params.logprobs set)

    def __post_init__(self) -> None:
        if not self.bucket:
            self.bucket = temperature_bucket(self.params.temperature)

    @cached_property
    def classes(self) -> tuple[str, ...]:
        """What the row's acceptance is judged by (`engines.modes.ModeCosts`), most specific first: its mode
        with its domain and temperature bucket, its mode with its temperature bucket (what moves
        acceptance most), its mode. Read for every row every step; fixed for the request, so built once."""
        t = self.bucket
        head = (f"{self.mode}|d={self.domain}|t={t}",) if self.domain else ()
        return (*head, f"{self.mode}|t={t}", self.mode)

    def pending_for(self, drafter: Drafter) -> Pending:
        return self.pending.setdefault(id(drafter), Pending())

    def feed(self, feats: dict[int, Tensor], row: int, upto: int, start: int, next_tokens: Sequence[int]) -> None:
        """Give every drafter of this row the features of row `row`'s first `upto` positions of a forward
        (`feats`: id(drafter) -> [B, T, F]), committed from position `start` on."""
        for d in self.drafters:
            self.pending_for(d).append(feats[id(d)][row, :upto], start, next_tokens)


def backlog_groups(backlog: Sequence[int], steady: int) -> list[list[int]]:
    """Rows of one drafter call by how much new context each brings ([B] positions): those with at most
    `steady` (a step's worth), then those catching up on more (a prompt just prefilled, steps spent with
    another drafter or none), each group one call padded to its own longest, so one new request's
    300-token prompt does not pad seven steady rows' 4 positions to 300. One group when all are alike."""
    short = [b for b, n in enumerate(backlog) if n <= steady]
    long = [b for b, n in enumerate(backlog) if n > steady]
    return [g for g in (short, long) if g]
