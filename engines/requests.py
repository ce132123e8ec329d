"""What a serving backend (our batcher, the null engine, the vLLM adapter) takes and gives back.

A caller submits a `GenRequest` with a `sink(Event)` callable and gets a handle; the backend calls the
sink from its own thread with one `Event` per delta, the last one carrying `finish_reason` and the
request's `RequestStats`. A full waiting queue is `QueueFull`, a draining backend `Closed`. Metrics
hook in through a `BatcherObserver`; `LoadSnapshot` is what the worker's `Load` reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.logprobs import TokenLogprob
from engines.sampling import SamplingParams
from specroute.contracts.stats import AcceptanceStats


class QueueFull(Exception):
    """The waiting queue is at its bound (gRPC RESOURCE_EXHAUSTED)."""


class Closed(Exception):
    """The batcher is draining or stopped and admits nothing new (gRPC UNAVAILABLE)."""


@dataclass(frozen=True)
class BatcherConfig:
    max_running: int = 32          # cache slots = requests decoding at once
    max_waiting: int = 128         # admitted but not yet in a slot
    max_len: int = 1024            # context per request (prompt + output)
    prefill_chunk: int = 128       # prompt tokens per prefill forward
    prefill_budget: int = 256      # prompt tokens per step while other requests decode
    k: int | None = None           # draft tokens per step (None: the drafter's max_draft)


@dataclass
class GenRequest:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    request_id: str = ""
    deadline: float | None = None   # time.monotonic() instant
    disable_dcut: bool = False
    domain: str = ""
    pool: str = ""
    context: str = ""               # the gateway's request context key, for statistics
    features: tuple[float, ...] = ()  # the gateway's request features, copied into the feedback record
    mode: str = ""                  # engine mode on a multi-mode worker ("": its default)
    temperature_bucket: str = ""    # "0" | "low" | "high", as the gateway computed it (GenerateRequest)
    # a continuation: the last `prefix_len` prompt ids are completion tokens another worker already
    # produced (and `prefix_chars` characters of their text were sent); `max_tokens` excludes them
    prefix_len: int = 0
    prefix_chars: int = 0
    # the grammar the output must match (an `engines.grammar.Constraint`, built by the worker from the
    # request's `GrammarSpec`); None: unconstrained. A continuation's constraint has consumed its prefix.
    constraint: Any = None


@dataclass
class RequestStats:
    """One finished request: token counts, latency, and its speculative acceptance."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0            # submission to first token
    wall_s: float = 0.0            # submission to finish
    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)
    cached_prompt_tokens: int = 0  # of prompt_tokens, read from a prefix cache instead of prefilled


@dataclass
class Event:
    """One delta of a request's stream. `finish_reason` set on the last one:
    stop | length | cancelled | deadline | error | shutdown."""

    token_ids: list[int]
    text: str
    t: float                                   # time.perf_counter() when emitted
    finish_reason: str = ""
    stats: RequestStats | None = None
    error: str = ""
    # the logprobs of `token_ids` other than end-of-sequence ones, in order (the request asked for them)
    logprobs: list[TokenLogprob] | None = None


Sink = Callable[[Event], None]


@dataclass(eq=False)
class Handle:
    request: GenRequest
    sink: Sink
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)


class BatcherObserver:
    """Hooks for metrics (called on the loop thread; keep them cheap). No-ops by default."""

    def on_step(self, keep: Sequence[int], accepted: Sequence[int], kept_fraction: float | None) -> None: ...

    def on_dcut_cut(self, drafts: int) -> None:
        """A drafted step where D-Cut left `drafts` (> 0) drafts unverified that the rows' limits allowed."""

    def on_tokens(self, n: int) -> None: ...

    def on_load(self, running: int, waiting: int) -> None: ...

    def on_finish(self, handle: Handle, stats: RequestStats, finish_reason: str) -> None: ...


@dataclass(frozen=True)
class LoadSnapshot:
    running: int                   # requests holding a cache slot
    waiting: int                   # submitted, not yet in a slot
    cache_usage: float             # running / max_running
    tokens_per_s: float            # output tokens over the last 10 s
    mean_accepted_length: float    # recent tokens per verification step (EMA), bonus included
    max_running: int               # cache slots
