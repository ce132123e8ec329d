"""What the gRPC servicer needs from an engine, and the local (our own batcher) implementation.

Three backends speak the same contract: `LocalBackend` (ar, mtp, dflash, dfly over our `Batcher`),
`NullBackend` (fixed text, no model: the gateway's overhead benchmark only) and `VllmBackend`
(`engines.vllm_adapter`, GPU machines).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engines.batcher import Batcher
from engines.errors import EngineError
from engines.grammar import Constraint, GrammarCompiler
from engines.requests import BatcherConfig, Closed, GenRequest, LoadSnapshot, QueueFull, Sink
from specroute.contracts.grammar import GrammarSpec
from specroute.errors import UserError


@dataclass(frozen=True)
class ModeInfo:
    """One engine mode a worker serves (`InfoResponse.modes`)."""

    engine: str                    # ar | mtp | dflash | dfly | ...
    drafter: str                   # "" for ar
    block_size: int                # draft tokens per step in this mode


@dataclass(frozen=True)
class BackendInfo:
    model_id: str                  # model directory name (or HF id)
    engine: str                    # --engine
    drafter: str                   # drafter kind / vLLM method ("" without one)
    block_size: int                # draft tokens per step
    max_context: int               # tokens per request (prompt + output)
    max_running: int               # requests decoding at once
    max_waiting: int               # queued beyond those
    # tokens per forward at which a forward costs twice a one-token one (engines/forward_cost.py;
    # 0 = not measured): the router's load term for this pool
    compute_bound_tokens: float = 0.0
    modes: tuple[ModeInfo, ...] = ()   # every mode served (default first); empty: just `engine`
    vocab_size: int = 0                # token ids are below it (0: not known), for continuations

    def mode_names(self) -> list[str]:
        return [m.engine for m in self.modes] or [self.engine]


@dataclass(eq=False)
class TaskHandle:
    """A request running as an asyncio task."""

    request: GenRequest
    sink: Sink
    request_id: str = ""
    task: asyncio.Task | None = None
    submitted: float = field(default_factory=time.perf_counter)


class AsyncTaskBackend:
    """Shared bookkeeping for backends that run each request as an asyncio task and have no D-Cut
    (`NullBackend`, `VllmBackend`): subclasses set `max_running`, `max_waiting`, `self._active`
    (their `TaskHandle`s) and `self._closed`, and start each task with `_spawn`."""

    max_running: int
    max_waiting: int
    _active: set[TaskHandle]
    _closed: bool

    def _admit(self) -> None:
        """Raise `Closed` / `QueueFull` when a new request cannot be taken."""
        if self._closed:
            raise Closed("worker is shutting down")
        if len(self._active) >= self.max_running + self.max_waiting:
            raise QueueFull(f"waiting queue is full ({self.max_waiting} requests); retry later")

    def _snapshot(self, tokens_per_s: float) -> LoadSnapshot:
        running = min(len(self._active), self.max_running)
        return LoadSnapshot(running, len(self._active) - running, running / self.max_running, tokens_per_s, 0.0,
                            self.max_running)

    def cancel(self, handle: TaskHandle) -> None:
        if handle.task is not None and not handle.task.done():
            handle.task.cancel()

    def close(self) -> None:
        self._closed = True

    def wait_idle(self, timeout: float | None = None) -> bool:
        return not self._active

    def stop(self) -> None:
        self._closed = True
        for h in list(self._active):
            self.cancel(h)

    def set_dcut(self, on: bool) -> bool:
        return False

    @property
    def dcut_enabled(self) -> bool:
        return False

    @property
    def kept_ratio(self) -> float:
        return 1.0


class Backend(Protocol):
    info: BackendInfo

    def tokenize(self, messages: Sequence[dict] | None, prompt: str) -> list[int]: ...

    def submit(self, request: GenRequest, sink: Sink) -> Any: ...

    def cancel(self, handle: Any) -> None: ...

    def close(self) -> None: ...

    def wait_idle(self, timeout: float | None = None) -> bool: ...

    def stop(self) -> None: ...

    def load(self) -> LoadSnapshot: ...

    def set_dcut(self, on: bool) -> bool: ...

    @property
    def dcut_enabled(self) -> bool: ...

    @property
    def kept_ratio(self) -> float: ...


class LocalBackend:
    """Our engine: target + drafter + SpecDecoder + Batcher (one model thread)."""

    def __init__(self, settings, observer=None) -> None:
        from engines.factory import load_engine, make_batcher
        from engines.forward_cost import measure_compute_bound
        from engines.worker.settings import DEFAULT_CONTEXT

        try:
            self.engine = load_engine(settings.engine, settings.model, settings.block_size)
        except EngineError as exc:
            raise UserError(str(exc)) from None
        cfg = BatcherConfig(max_running=settings.max_running, max_waiting=settings.max_waiting,
                            max_len=settings.context_length or min(self.engine.max_context, DEFAULT_CONTEXT),
                            prefill_chunk=settings.prefill_chunk, prefill_budget=settings.prefill_budget,
                            k=settings.k)
        self.batcher: Batcher = make_batcher(self.engine, cfg, dcut=settings.dcut, threads=settings.threads,
                                             profile_dir=settings.dcut_profile_dir, observer=observer)
        self.tokenizer = self.engine.tokenizer
        self._grammars: GrammarCompiler | None = None
        drafter = self.engine.drafter
        k = self.batcher.k
        modes = tuple(ModeInfo(m, d.kind if d is not None else "", min(k, self.engine.mode_block_size(m)))
                      for m, d in self.engine.modes.items())
        self.info = BackendInfo(
            model_id=settings.model.resolve().name, engine=self.engine.kind,
            drafter=drafter.kind if drafter is not None else "",
            block_size=modes[0].block_size, max_context=self.batcher.decoder.max_len,
            max_running=settings.max_running, max_waiting=settings.max_waiting,
            compute_bound_tokens=measure_compute_bound(self.engine.target),   # before serving: ~0.3 s
            modes=modes, vocab_size=self.engine.target.config.vocab_size,
        )
        # the decoder splits a verify over rows of different widths (several modes) by this cost model
        self.batcher.decoder.compute_bound_tokens = self.info.compute_bound_tokens
        self.batcher.start()

    supports_logprobs = True   # GenerateRequest.logprobs: computed by the decoder (engines/logprobs.py)

    def token_piece(self, token_id: int) -> tuple[str, bytes]:
        return self.tokenizer.token_piece(token_id)

    def tokenize(self, messages: Sequence[dict] | None, prompt: str, tools: Sequence[dict] | None = None) -> list[int]:
        if messages:
            return self.tokenizer.encode_chat(list(messages), list(tools) if tools else None)
        return self.tokenizer.encode(prompt)

    def constrain(self, spec: GrammarSpec, prefix: Sequence[int] = ()) -> Constraint:
        """A fresh grammar state for `spec` (UserError when it does not compile), past `prefix`'s tokens."""
        if self._grammars is None:   # the tokenizer's grammar view: built once (~0.1-1 s)
            self._grammars = GrammarCompiler(self.tokenizer.inner.to_str(), self.info.vocab_size, self.tokenizer.eos_id)
        c = self._grammars.constraint(spec)
        for t in prefix:
            if not bool(c.mask()[t]):
                raise UserError("prefix_token_ids: the continuation does not match the grammar")
            c.consume(t)
        return c

    def submit(self, request: GenRequest, sink: Sink):
        return self.batcher.submit(request, sink)

    def cancel(self, handle) -> None:
        self.batcher.cancel(handle)

    def close(self) -> None:
        self.batcher.close()

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.batcher.wait_idle(timeout)

    def stop(self) -> None:
        self.batcher.stop()

    def load(self) -> LoadSnapshot:
        return self.batcher.load()

    def set_dcut(self, on: bool) -> bool:
        return self.batcher.set_dcut(on)

    @property
    def dcut_enabled(self) -> bool:
        return self.batcher.dcut_enabled

    @property
    def kept_ratio(self) -> float:
        d = self.batcher.dcut
        return d.kept_fraction_ema if d is not None and d.enabled else 1.0
