"""Continuous batching over the slot KV cache, driven by ONE model thread.

Each loop iteration (a "step"):

1. take messages from the inbox (new requests, cancellations, stop);
2. finish cancelled and expired requests, freeing their slots at once;
3. admit waiting requests into free slots (`SpecDecoder.start`);
4. prefill: prompt chunks up to a per-step token budget, so a long prompt never stalls the running
   requests for more than one chunk (prompts that fit whole share one forward); a request emits y0;
5. decode: ONE batched `draft` for every running request, the verification depth per row (all k, or
   D-Cut's global top-K), ONE batched `verify`, then tokens go through each request's `StopState`
   and out to its sink. Finished requests release their slot immediately.

The loop thread never touches asyncio objects: each request carries a `sink(Event)` callable (the
worker's sink does `loop.call_soon_threadsafe(queue.put_nowait, event)`). Submission, cancellation
and shutdown are messages into a thread-safe inbox; the waiting-queue bound is checked at
submission time so a full queue is an immediate `QueueFull`.

One step's draft -> D-Cut -> verify is `engines.step.decode_step`; request and event types are in
`engines.requests`; building an engine and its batcher is `engines.factory`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engines.dcut.controller import DcutController
from engines.logprobs import TokenLogprob
from engines.logprobs import take as take_logprobs
from engines.requests import (
    BatcherConfig,
    BatcherObserver,
    Closed,
    Event,
    GenRequest,
    Handle,
    LoadSnapshot,
    QueueFull,
    RequestStats,
    Sink,
)
from engines.spec import SpecDecoder
from engines.step import decode_step
from engines.stopping import StopState

log = logging.getLogger("specroute.batcher")


@dataclass(eq=False)
class _Active:
    handle: Handle
    stop: StopState
    slot: int = -1
    prefilled: int = 0
    emitted: int = 0
    t_first: float = 0.0
    ready: bool = False      # prompt in the cache, y0 emitted
    drafted_steps: int = 0   # steps that verified drafts for this request (D-Cut's per-row estimate)
    drafted_tokens: int = 0  # tokens those steps emitted for it

    def observe_drafted(self, tokens: int) -> None:
        self.drafted_steps += 1
        self.drafted_tokens += tokens

    @property
    def req(self) -> GenRequest:
        return self.handle.request


class Batcher:
    """Continuous batching over a `SpecDecoder` (any engine kind, AR included)."""

    def __init__(self, decoder: SpecDecoder, decode_text: Callable[[list[int]], str], eos_ids: Sequence[int],
                 config: BatcherConfig, dcut: DcutController | None = None,
                 observer: BatcherObserver | None = None) -> None:
        if config.max_running > decoder.num_slots:
            raise ValueError(f"max_running {config.max_running} > decoder slots {decoder.num_slots}")
        self.decoder = decoder
        self.decode_text = decode_text
        self.eos_ids = frozenset(eos_ids)
        self.config = config
        max_draft = int(getattr(decoder, "max_draft", 0))   # the widest mode's
        self.k = max_draft if config.k is None else max(0, min(int(config.k), max_draft))
        self.dcut = dcut
        self.observer = observer or BatcherObserver()
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()  # (kind, Handle | callable | None)
        self._lock = threading.Lock()
        self._pending = 0                       # submitted, not yet in a slot (waiting queue size)
        self._closed = False
        self._waiting: deque[_Active] = deque()
        self._prefilling: list[_Active] = []
        self._running: list[_Active] = []
        self._free = list(range(config.max_running))
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._recent: deque[tuple[float, int]] = deque()
        self._mal_ema = 0.0
        self.steps = 0
        self.draft_steps = 0              # decode steps that verified drafts
        self.kept_fraction_sum = 0.0      # sum over those of D-Cut's kept fraction (1.0 when off)
        self.verify_groups = 0            # extra verify forwards D-Cut's depth grouping added
        self.probe_steps = 0              # D-Cut probes: a few rows drafted while plain steps win
        self.dcut_cut_steps = 0           # drafted steps where D-Cut left drafts unverified
        self.dcut_cut_drafts = 0          # the drafts it left unverified (within the rows' limits)
        self.rows_drafted = 0             # rows verified with >= 1 draft (vLLM's num_drafts)
        self.decode_steps = 0
        self.accepted_total = 0           # drafts accepted (vLLM's num_accepted_tokens)
        self._last_decode: tuple[float, float] | None = None   # (start, draft + verify seconds) of a prefill-free decode step

    # --- public API (any thread) ------------------------------------------------------------------
    def start(self) -> Batcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="specroute-batcher", daemon=True)
            self._thread.start()
        return self

    def submit(self, request: GenRequest, sink: Sink) -> Handle:
        if request.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        with self._lock:
            if self._closed:
                raise Closed("worker is shutting down")
            if self._pending >= self.config.max_waiting:
                raise QueueFull(f"waiting queue is full ({self.config.max_waiting} requests); retry later")
            self._pending += 1
            self._idle.clear()
        handle = Handle(request, sink)
        self._inbox.put(("submit", handle))
        return handle

    def cancel(self, handle: Handle) -> None:
        handle.cancelled = True
        self._inbox.put(("cancel", handle))

    def close(self) -> None:
        """Stop admitting; running and waiting requests continue (graceful drain)."""
        with self._lock:
            self._closed = True

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish every remaining request with 'shutdown' and end the loop thread."""
        self.close()
        self._inbox.put(("stop", None))
        if self._thread is not None:
            self._thread.join(timeout)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the model thread between two steps (e.g. to change weights safely)."""
        self._inbox.put(("call", fn))

    def drafter_changed(self, drafter: Any) -> None:
        """On the model thread, after `drafter`'s weights changed: D-Cut and the decoder forget what they
        learned of its acceptance, and so do the running rows' records (engines/worker/degrade.py)."""
        if self.dcut is not None:
            self.dcut.forget_acceptance()
        self.decoder.forget_drafter(drafter)
        for a in self._running:
            a.drafted_steps = a.drafted_tokens = 0

    def set_dcut(self, on: bool) -> bool:
        if self.dcut is None:
            return False
        self.dcut.set_enabled(on)
        return self.dcut.enabled

    @property
    def dcut_enabled(self) -> bool:
        return self.dcut is not None and self.dcut.enabled

    def load(self) -> LoadSnapshot:
        with self._lock:
            waiting = self._pending
        running = self.config.max_running - len(self._free)
        now = time.perf_counter()
        recent = list(self._recent)
        toks = sum(n for t, n in recent if now - t <= 10.0)
        span = min(10.0, now - recent[0][0]) if recent else 0.0
        tps = toks / span if span > 0.5 else 0.0
        return LoadSnapshot(running, waiting, running / self.config.max_running, tps, self._mal_ema,
                            self.config.max_running)

    # --- the loop thread --------------------------------------------------------------------------
    def _run(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                busy = bool(self._waiting or self._prefilling or self._running)
                if not busy:
                    with self._lock:
                        if self._pending == 0:
                            self._idle.set()
                if not self._drain_inbox(block=not busy):
                    break
                try:
                    self._step()
                except Exception as exc:  # a bug or a bad request: fail what is active, keep serving
                    log.exception("batcher step failed")
                    self._fail_all(f"engine error: {type(exc).__name__}: {exc}")
        self._idle.set()

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued messages. Returns False when the loop must end."""
        try:
            msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, handle = msg
            if kind == "submit":
                assert handle is not None
                req = handle.request
                prefix = req.prompt_ids[len(req.prompt_ids) - req.prefix_len:] if req.prefix_len else []
                stop = StopState(self.decode_text, self.eos_ids, req.stop, req.max_tokens + req.prefix_len,
                                 tokens=list(prefix), emitted_chars=req.prefix_chars)
                self._waiting.append(_Active(handle, stop))
            elif kind == "stop":
                self._finish_everything("shutdown")
                return False
            elif kind == "call":
                try:
                    handle()
                except Exception:
                    log.exception("call on the model thread failed")
            # "cancel" needs no work here: the handle's flag is checked in _step
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _step(self) -> None:
        t_step = time.perf_counter()
        if self._last_decode is not None:   # the last step only decoded: what it cost beyond its forwards
            t0, modeled = self._last_decode
            costs = getattr(self.decoder, "costs", None)
            if costs is not None:
                costs.observe_step((t_step - t0) * 1000.0, modeled * 1000.0)
            self._last_decode = None
        now = time.monotonic()
        for group in (self._running, self._prefilling):
            for a in list(group):
                reason = self._expired(a, now)
                if reason:
                    group.remove(a)
                    self._finish(a, reason)
        for a in list(self._waiting):
            reason = self._expired(a, now)
            if reason:
                self._waiting.remove(a)
                with self._lock:
                    self._pending -= 1
                self._finish(a, reason)
        self._admit()
        prefilling = bool(self._prefilling)
        self._prefill()
        if self._running:
            timing = getattr(self.decoder, "timing", None)   # (test doubles have none)
            spent = timing.draft_s + timing.verify_s if timing is not None else 0.0
            self._decode()
            if not prefilling and timing is not None and self._running:   # (rows left: the loop does not wait)
                self._last_decode = (t_step, timing.draft_s + timing.verify_s - spent)
        self.steps += 1
        self.observer.on_load(len(self._running) + len(self._prefilling), self._pending)

    @staticmethod
    def _expired(a: _Active, now: float) -> str:
        if a.handle.cancelled:
            return "cancelled"
        if a.req.deadline is not None and now > a.req.deadline:
            return "deadline"
        return ""

    def _admit(self) -> None:
        while self._waiting and self._free:
            a = self._waiting.popleft()
            with self._lock:
                self._pending -= 1
            a.slot = self._free.pop(0)
            try:
                self.decoder.start(a.slot, a.req.prompt_ids, a.req.params, a.req.mode or None, a.req.domain,
                                  a.req.temperature_bucket, a.req.constraint)
            except Exception as exc:
                self._finish(a, "error", error=str(exc))
                continue
            self._prefilling.append(a)

    def _prefill(self) -> None:
        budget = self.config.prefill_budget if self._running else max(self.config.prefill_budget, 1 << 30)
        whole: list[_Active] = []                  # rows whose whole prompt goes in this step
        done: list[tuple[_Active, int]] = []       # rows whose prompt is in: (row, y0)
        for a in list(self._prefilling):
            if budget <= 0:
                break
            remaining = len(a.req.prompt_ids) - a.prefilled
            n = min(remaining, self.config.prefill_chunk, budget)
            budget -= n
            if a.prefilled == 0 and n == remaining > 0:
                whole.append(a)
            elif (y0 := self.decoder.prefill_step(a.slot, n)) is not None:
                done.append((a, y0))
            else:
                a.prefilled += n
        done += zip(whole, self.decoder.prefill_started([a.slot for a in whole]), strict=True) if whole else []
        for a, y0 in done:
            a.prefilled, a.ready, a.t_first = len(a.req.prompt_ids), True, time.perf_counter()
            self._prefilling.remove(a)
            if self._emit(a, [y0]):
                self._running.append(a)

    def _decode(self) -> None:
        rows = self._running
        res = decode_step(self.decoder, [a.slot for a in rows], [a.req.max_tokens - a.emitted for a in rows],
                          self.k, self.dcut if self.dcut_enabled else None, [a.req.disable_dcut for a in rows],
                          [(a.drafted_steps, a.drafted_tokens) for a in rows])
        self.decode_steps += 1
        self.verify_groups += res.extra_forwards
        if res.probe:
            self.probe_steps += 1
        elif res.kept_fraction is not None:
            self.draft_steps += 1
            self.kept_fraction_sum += res.dcut_kept_fraction
            if res.dcut_cut:
                self.dcut_cut_steps += 1
                self.dcut_cut_drafts += res.dcut_cut
                self.observer.on_dcut_cut(res.dcut_cut)
        if res.verified_drafts:
            self.rows_drafted += sum(1 for kp in res.keep if kp > 0)
            self.accepted_total += sum(res.accepted)
        for i in res.drafted:
            rows[i].observe_drafted(len(res.out[i]))
        self.observer.on_step(res.keep, res.accepted, res.kept_fraction)
        self._finish_step(rows, res.out)

    def _finish_step(self, rows: list[_Active], out: list[list[int]]) -> None:
        step_tokens = sum(len(o) for o in out)
        self._mal_ema = step_tokens / len(rows) if self._mal_ema == 0.0 else (
            0.98 * self._mal_ema + 0.02 * step_tokens / len(rows))
        for a, toks in zip(list(rows), out, strict=True):
            if not self._emit(a, toks):
                self._running.remove(a)

    def _emit(self, a: _Active, tokens: list[int]) -> bool:
        """Push tokens through the request's StopState and send the delta. False when finished."""
        text, used = a.stop.push_many(tokens)
        ids = tokens[:used]
        lps = self._logprobs(a, len(tokens), used)
        a.emitted += used
        now = time.perf_counter()
        self._recent.append((now, used))
        while self._recent and now - self._recent[0][0] > 10.0:
            self._recent.popleft()
        self.observer.on_tokens(used)
        if a.stop.done:
            self._finish(a, a.stop.finish_reason, ids=ids, text=text, logprobs=lps)
            return False
        if ids or text:
            self._send(a, Event(ids, text, now, logprobs=lps))
        return True

    def _logprobs(self, a: _Active, emitted: int, used: int) -> list[TokenLogprob] | None:
        """The logprobs of the first `used` of the `emitted` tokens the slot just emitted, end-of-sequence
        tokens left out (they are no text); None when the request did not ask for them."""
        st = self.decoder.slots.get(a.slot) if a.req.params.logprobs is not None else None
        if st is None:
            return None
        return [lp for lp in take_logprobs(st.logprobs, emitted)[:used] if lp.token_id not in self.eos_ids]

    def _finish(self, a: _Active, reason: str, ids: list[int] | None = None, text: str = "",
                error: str = "", logprobs: list[TokenLogprob] | None = None) -> None:
        now = time.perf_counter()
        stats = RequestStats(prompt_tokens=len(a.req.prompt_ids), completion_tokens=a.emitted,
                             ttft_s=(a.t_first - a.handle.submitted) if a.t_first else 0.0,
                             wall_s=now - a.handle.submitted)
        if a.slot >= 0:
            st = self.decoder.slots.get(a.slot)
            if st is not None:
                stats.acceptance = st.stats        # the slot's record; released (never mutated) below
            self.decoder.release(a.slot)
            self._free.append(a.slot)
            self._free.sort()
            a.slot = -1
        self.observer.on_finish(a.handle, stats, reason)
        self._send(a, Event(ids or [], text, now, reason, stats, error, logprobs))

    def _send(self, a: _Active, ev: Event) -> None:
        try:
            a.handle.sink(ev)
        except Exception:  # a dead client's sink must not take the loop down
            log.debug("sink failed for %s", a.req.request_id, exc_info=True)

    def _fail_all(self, error: str) -> None:
        for group in (self._running, self._prefilling):
            for a in list(group):
                group.remove(a)
                try:
                    self._finish(a, "error", error=error)
                except Exception:
                    log.exception("releasing a failed request")

    def _finish_everything(self, reason: str) -> None:
        for a in list(self._running) + list(self._prefilling):
            self._finish(a, reason)
        self._running.clear()
        self._prefilling.clear()
        while self._waiting:
            a = self._waiting.popleft()
            with self._lock:
                self._pending -= 1
            self._finish(a, reason)
