"""`--engine null`: a named test double that emits fixed text without a model.

Only for measuring the gateway's own overhead (`specroute bench gateway`): it speaks exactly the
same gRPC contract (`Info.engine == "null"`), honours max_tokens, cancellation, deadlines and the
queue bounds, and reports zero speculative statistics. Tokens are whitespace-separated words of
`null_text`; prompts are "tokenized" by splitting on whitespace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from engines.requests import Event, GenRequest, LoadSnapshot, RequestStats, Sink
from engines.worker.backend import AsyncTaskBackend, BackendInfo, TaskHandle


class NullBackend(AsyncTaskBackend):
    def __init__(self, settings) -> None:
        self.words = settings.null_text.split() or ["x"]
        self.delay = settings.null_token_delay_ms / 1000.0
        self.max_running = settings.max_running
        self.max_waiting = settings.max_waiting
        self.info = BackendInfo(model_id="null", engine="null", drafter="", block_size=0,
                                max_context=settings.context_length or 1 << 20,
                                max_running=settings.max_running, max_waiting=settings.max_waiting)
        self._active: set[TaskHandle] = set()
        self._closed = False
        self._slots = asyncio.Semaphore(settings.max_running)
        self._idle = asyncio.Event()
        self._idle.set()
        self._tokens = 0
        self._t0 = time.perf_counter()

    def tokenize(self, messages: Sequence[dict] | None, prompt: str) -> list[int]:
        text = " ".join(m["content"] for m in messages) if messages else prompt
        return [len(w) for w in text.split()]

    def submit(self, request: GenRequest, sink: Sink) -> TaskHandle:
        self._admit()
        h = TaskHandle(request, sink)
        self._active.add(h)
        self._idle.clear()
        h.task = asyncio.get_running_loop().create_task(self._run(h))
        return h

    async def _run(self, h: TaskHandle) -> None:
        req = h.request
        n = 0
        reason = "length"
        t_first = 0.0
        try:
            async with self._slots:
                for i in range(req.max_tokens):
                    if req.deadline is not None and time.monotonic() > req.deadline:
                        reason = "deadline"
                        break
                    word = self.words[i % len(self.words)]
                    text = word if i == 0 else " " + word
                    n += 1
                    self._tokens += 1
                    if not t_first:
                        t_first = time.perf_counter()
                    if i == req.max_tokens - 1:
                        break
                    h.sink(Event([i % 997], text, time.perf_counter()))
                    await asyncio.sleep(self.delay)
                stats = RequestStats(prompt_tokens=len(req.prompt_ids), completion_tokens=n,
                                     ttft_s=t_first - h.submitted, wall_s=time.perf_counter() - h.submitted)
                last = self.words[(n - 1) % len(self.words)] if reason == "length" else ""
                h.sink(Event([(n - 1) % 997] if last else [], (" " + last) if last and n > 1 else last,
                             time.perf_counter(), reason, stats))
        except asyncio.CancelledError:
            h.sink(Event([], "", time.perf_counter(), "cancelled", RequestStats(completion_tokens=n)))
        finally:
            self._active.discard(h)
            if not self._active:
                self._idle.set()

    def load(self) -> LoadSnapshot:
        span = time.perf_counter() - self._t0
        return self._snapshot(self._tokens / span if span > 0 else 0.0)
