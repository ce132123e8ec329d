"""What the gRPC servicer needs from an engine, and the local (our own batcher) implementation.

Three backends speak the same contract: `LocalBackend` (ar, mtp, dflash, dfly over our `Batcher`),
`NullBackend` (fixed text, no model: the gateway's overhead benchmark only) and `VllmBackend`
(`engines.vllm_adapter`, GPU machines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engines.batcher import Batcher, BatcherConfig, GenRequest, LoadSnapshot, Sink, make_batcher


@dataclass(frozen=True)
class BackendInfo:
    model_id: str
    engine: str
    drafter: str
    block_size: int
    max_context: int
    max_running: int
    max_waiting: int


class AsyncTaskBackend:
    """Shared bookkeeping for backends that run each request as an asyncio task (`NullBackend`,
    `VllmBackend`): subclasses keep `self._active` (handles with a `.task`) and `self._closed`."""

    _active: set[Any]
    _closed: bool

    def cancel(self, handle: Any) -> None:
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
        from engines.batcher import build_engine

        max_len = settings.context_length
        self.engine = build_engine(settings.engine, settings.model, settings.max_running, max_len,
                                   settings.block_size, settings.prefill_chunk)
        cfg = BatcherConfig(max_running=settings.max_running, max_waiting=settings.max_waiting,
                            max_len=self.engine.decoder.max_len, prefill_chunk=settings.prefill_chunk,
                            prefill_budget=settings.prefill_budget, k=settings.k)
        self.batcher: Batcher = make_batcher(self.engine, cfg, dcut=settings.dcut, threads=settings.threads,
                                             profile_dir=settings.dcut_profile_dir, observer=observer)
        self.tokenizer = self.engine.tokenizer
        drafter = self.engine.drafter
        self.info = BackendInfo(
            model_id=settings.model.resolve().name, engine=settings.engine,
            drafter=getattr(drafter, "kind", "") if drafter is not None else "",
            block_size=self.batcher.k, max_context=self.engine.decoder.max_len,
            max_running=settings.max_running, max_waiting=settings.max_waiting,
        )
        self.batcher.start()

    def tokenize(self, messages: Sequence[dict] | None, prompt: str) -> list[int]:
        if messages:
            return self.tokenizer.encode_chat(list(messages))
        return self.tokenizer.encode(prompt)

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
