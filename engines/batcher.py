"""Continuous batching over the slot KV cache, driven by ONE model thread.

Each loop iteration (a "step"):

1. take messages from the inbox (new requests, cancellations, stop);
2. finish cancelled and expired requests, freeing their slots at once;
3. admit waiting requests into free slots (`SpecDecoder.start`);
4. prefill: feed prompt chunks up to a per-step token budget, so a long prompt never stalls the
   running requests for more than one chunk; a request whose prompt is in the cache emits y0;
5. decode: ONE batched `draft` for every running request, the verification depth per row (all k, or
   D-Cut's global top-K), ONE batched `verify`, then tokens go through each request's `StopState`
   and out to its sink. Finished requests release their slot immediately.

The loop thread never touches asyncio objects: each request carries a `sink(Event)` callable (the
worker's sink does `loop.call_soon_threadsafe(queue.put_nowait, event)`). Submission, cancellation
and shutdown are messages into a thread-safe inbox; the waiting-queue bound is checked at
submission time so a full queue is an immediate `QueueFull`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engines.dcut import DcutController, prefix_scores
from engines.sampling import SamplingParams
from engines.stopping import StopState

log = logging.getLogger("specroute.batcher")

ENGINE_KINDS = ("ar", "mtp", "dflash", "dfly")


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


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    wall_s: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification step, bonus included (vLLM convention)."""
        return (self.steps + self.accepted) / self.steps if self.steps else 0.0


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


Sink = Callable[[Event], None]


@dataclass(eq=False)
class Handle:
    request: GenRequest
    sink: Sink
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)


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


class BatcherObserver:
    """Hooks for metrics (called on the loop thread; keep them cheap). No-ops by default."""

    def on_step(self, keep: Sequence[int], accepted: Sequence[int], kept_fraction: float | None) -> None: ...

    def on_tokens(self, n: int) -> None: ...

    def on_load(self, running: int, waiting: int) -> None: ...

    def on_finish(self, handle: Handle, stats: RequestStats, finish_reason: str) -> None: ...


@dataclass(frozen=True)
class LoadSnapshot:
    running: int
    waiting: int
    cache_usage: float
    tokens_per_s: float
    mean_accepted_length: float
    max_running: int


class Batcher:
    """Continuous batching over a `SpecDecoder` (any engine kind, AR included)."""

    def __init__(self, decoder, decode_text: Callable[[list[int]], str], eos_ids: Sequence[int],
                 config: BatcherConfig, dcut: DcutController | None = None,
                 observer: BatcherObserver | None = None) -> None:
        if config.max_running > decoder.num_slots:
            raise ValueError(f"max_running {config.max_running} > decoder slots {decoder.num_slots}")
        self.decoder = decoder
        self.decode_text = decode_text
        self.eos_ids = frozenset(eos_ids)
        self.config = config
        drafter = getattr(decoder, "drafter", None)
        max_draft = int(drafter.max_draft) if drafter is not None else 0
        self.k = max_draft if config.k is None else max(0, min(int(config.k), max_draft))
        self.dcut = dcut
        self.observer = observer or BatcherObserver()
        self._inbox: queue.SimpleQueue[tuple[str, Handle | None]] = queue.SimpleQueue()
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
        self._cost_scale = 1.0
        self.steps = 0
        self.draft_steps = 0              # decode steps that verified drafts
        self.kept_fraction_sum = 0.0      # sum over those of D-Cut's kept fraction (1.0 when off)
        self.verify_groups = 0            # extra verify forwards D-Cut's depth grouping added
        self.probe_steps = 0              # D-Cut probes: a few rows drafted while plain steps win
        self.rows_drafted = 0             # rows verified with >= 1 draft (vLLM's num_drafts)
        self.decode_steps = 0
        self.accepted_total = 0           # drafts accepted (vLLM's num_accepted_tokens)

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
                stop = StopState(self.decode_text, self.eos_ids, req.stop, req.max_tokens)
                self._waiting.append(_Active(handle, stop))
            elif kind == "stop":
                self._finish_everything("shutdown")
                return False
            # "cancel" needs no work here: the handle's flag is checked in _step
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _step(self) -> None:
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
        self._prefill()
        if self._running:
            self._decode()
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
                self.decoder.start(a.slot, a.req.prompt_ids, a.req.params)
            except Exception as exc:
                self._finish(a, "error", error=str(exc))
                continue
            self._prefilling.append(a)

    def _prefill(self) -> None:
        budget = self.config.prefill_budget if self._running else max(self.config.prefill_budget, 1 << 30)
        for a in list(self._prefilling):
            if budget <= 0:
                break
            remaining = len(a.req.prompt_ids) - a.prefilled
            n = min(remaining, self.config.prefill_chunk, budget)
            y0 = self.decoder.prefill_step(a.slot, n)
            a.prefilled += n
            budget -= n
            if y0 is not None:
                self._prefilling.remove(a)
                a.ready = True
                a.t_first = time.perf_counter()
                if self._emit(a, [y0]):
                    self._running.append(a)

    def _decode(self) -> None:
        rows = self._running
        slots = [a.slot for a in rows]
        remaining = [a.stop.max_tokens - a.emitted for a in rows]
        self.decode_steps += 1
        k = max(0, min(self.k, max(remaining) - 1))
        dcut = self.dcut if self.dcut is not None and self.dcut.enabled else None
        forced = [a.req.disable_dcut for a in rows]
        picked = list(range(len(rows)))
        if k > 0 and dcut is not None and not any(forced):
            # all rows, none (a plain step) or a cheap probe of a few
            picked = dcut.rows_to_draft([(a.drafted_steps, a.drafted_tokens) for a in rows])
        if not picked:
            k = 0
        elif k > 0 and len(picked) < len(rows):
            assert dcut is not None
            self._probe_step(rows, slots, remaining, k, picked, dcut)
            return
        t0 = time.perf_counter()
        keep: list[int]
        sel = raw = None
        proposal = self.decoder.draft(slots, k) if k > 0 else None
        if proposal is None:
            keep = [0] * len(rows)
        else:
            K = int(proposal.tokens.shape[1])
            keep = [K] * len(rows)
            if dcut is not None:
                conf = proposal.conf.detach().float().cpu().numpy()
                sel, raw = dcut.select(conf, forced)
                keep = list(sel.keep)
        keep = [max(0, min(kp, r - 1)) for kp, r in zip(keep, remaining, strict=True)]
        t1 = time.perf_counter()
        groups = sel.groups if sel is not None and len(sel.groups) > 1 else None
        if groups is None:
            out = self.decoder.verify(slots, proposal, keep)
        else:   # D-Cut's depth groups: one padded forward per group instead of one padded to the widest row
            out = [[] for _ in rows]
            for g in groups:
                res = self.decoder.verify([slots[i] for i in g], _rows_of(proposal, g), [keep[i] for i in g])
                for i, o in zip(g, res, strict=True):
                    out[i] = o
            self.verify_groups += len(groups) - 1
        t2 = time.perf_counter()
        accepted = [len(o) - 1 for o in out]
        kept_fraction = None
        if proposal is not None and proposal.tokens.shape[1]:
            kept_fraction = sum(keep) / (len(rows) * int(proposal.tokens.shape[1]))
            self.draft_steps += 1
            self.kept_fraction_sum += sel.kept_fraction if sel is not None else 1.0
            self.rows_drafted += sum(1 for kp in keep if kp > 0)
            self.accepted_total += sum(accepted)
        if proposal is not None:
            for a, o, kp in zip(rows, out, keep, strict=True):
                if kp > 0:
                    a.observe_drafted(len(o))
        if sel is not None and raw is not None and dcut is not None:
            steady = self.decoder.last_ingest <= 2 * self.k + 2   # not a catch-up on a long backlog
            dcut.observe(raw, keep, accepted, kept_fraction or 0.0,
                         overhead_ms=(t1 - t0) * 1000.0 if steady else None, verify_ms=(t2 - t1) * 1000.0, sel=sel)
        self.observer.on_step(keep, accepted, kept_fraction)
        self._finish_step(rows, out)

    def _probe_step(self, rows: list[_Active], slots: list[int], remaining: list[int], k: int,
                    picked: list[int], dcut: DcutController) -> None:
        """D-Cut's probe while plain steps win: draft for the `picked` rows so their acceptance estimate
        stays current, verify them in their own forward and the others as a plain step."""
        B = len(rows)
        sub = self.decoder.draft([slots[i] for i in picked], k)
        assert sub is not None
        K = int(sub.tokens.shape[1])
        keep = [max(0, min(K if i in picked else 0, r - 1)) for i, r in enumerate(remaining)]
        out: list[list[int]] = [[] for _ in rows]
        others = [i for i in range(B) if i not in picked]
        for g, prop in ((picked, sub), (others, None)):
            if g:
                for i, o in zip(g, self.decoder.verify([slots[i] for i in g], prop, [keep[i] for i in g]), strict=True):
                    out[i] = o
        accepted = [len(o) - 1 for o in out]
        dcut.observe(prefix_scores(sub.conf.detach().float().cpu().numpy()), [keep[i] for i in picked],
                     [accepted[i] for i in picked], 1.0)
        for i in picked:
            rows[i].observe_drafted(len(out[i]))
        self.probe_steps += 1
        self.rows_drafted += sum(1 for i in picked if keep[i] > 0)
        self.accepted_total += sum(accepted[i] for i in picked)
        self.observer.on_step(keep, accepted, None)
        self._finish_step(rows, out)

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
        a.emitted += used
        now = time.perf_counter()
        self._recent.append((now, used))
        while self._recent and now - self._recent[0][0] > 10.0:
            self._recent.popleft()
        self.observer.on_tokens(used)
        if a.stop.done:
            self._finish(a, a.stop.finish_reason, ids=ids, text=text)
            return False
        if ids or text:
            self._send(a, Event(ids, text, now))
        return True

    def _finish(self, a: _Active, reason: str, ids: list[int] | None = None, text: str = "",
                error: str = "") -> None:
        now = time.perf_counter()
        stats = RequestStats(prompt_tokens=len(a.req.prompt_ids), completion_tokens=a.emitted,
                             ttft_s=(a.t_first - a.handle.submitted) if a.t_first else 0.0,
                             wall_s=now - a.handle.submitted)
        if a.slot >= 0:
            st = self.decoder.slots.get(a.slot) if hasattr(self.decoder, "slots") else None
            if st is not None:
                ss = st.stats
                stats.drafted, stats.accepted, stats.steps = ss.drafted, ss.accepted, ss.steps
                stats.accepted_per_position = list(ss.accepted_per_position)
            self.decoder.release(a.slot)
            self._free.append(a.slot)
            self._free.sort()
            a.slot = -1
        self.observer.on_finish(a.handle, stats, reason)
        self._send(a, Event(ids or [], text, now, reason, stats, error))

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


def _rows_of(proposal, rows: Sequence[int]):
    """The proposal restricted to some rows (for verifying a subset of the batch)."""
    import torch

    idx = torch.tensor(list(rows), dtype=torch.long)
    return type(proposal)(proposal.tokens[idx], proposal.conf[idx],
                          proposal.probs[idx] if proposal.probs is not None else None)


# --- building an engine ----------------------------------------------------------------------------


@dataclass
class Engine:
    """A loaded model + drafter + decoder, ready to wrap in a Batcher."""

    kind: str
    target: object
    drafter: object | None
    decoder: object
    tokenizer: object
    model_dir: Path
    block_size: int                  # draft tokens per step


def build_engine(kind: str, model_dir: str | Path, num_slots: int, max_len: int | None = None,
                 block_size: int | None = None, prefill_chunk: int = 128) -> Engine:
    """Load target, tokenizer and (for speculative kinds) the drafter from `model_dir`."""
    from engines.model import load_model
    from engines.spec import SpecDecoder
    from engines.tokenizer import Tokenizer
    from specroute.errors import UserError

    if kind not in ENGINE_KINDS:
        raise UserError(f"unknown engine {kind!r} (expected one of {', '.join(ENGINE_KINDS)})")
    model_dir = Path(model_dir)
    target = load_model(model_dir)
    tok = Tokenizer.load(model_dir)
    drafter = None
    if kind != "ar":
        from engines.drafters.registry import load_drafter

        drafter = load_drafter(kind, model_dir, target, block_size)
        drafter.eval()
    ctx = int(max_len or target.config.max_position_embeddings)
    decoder = SpecDecoder(target, drafter, num_slots, ctx, prefill_chunk=prefill_chunk)
    k = int(drafter.max_draft) if drafter is not None else 0
    return Engine(kind, target, drafter, decoder, tok, model_dir, k)


def make_batcher(engine: Engine, config: BatcherConfig, dcut: bool = False, threads: int = 1,
                 profile_dir: str | Path | None = None, observer: BatcherObserver | None = None) -> Batcher:
    controller = None
    k = engine.block_size if config.k is None else min(config.k, engine.block_size)
    if dcut and engine.drafter is not None and k > 0:
        from engines.dcut import load_or_profile

        table = load_or_profile(engine.target, engine.model_dir, k, threads, cache_dir=profile_dir,
                                decoder=engine.decoder, context=min(256, max(8, config.max_len // 2)),
                                capture=tuple(engine.drafter.capture_layers),
                                batch_sizes=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max(
                                    config.max_running, 1)) or (1,))
        controller = DcutController(table, k)
    eos = set(getattr(engine.target.config, "eos_ids", ()))
    eos.add(engine.tokenizer.eos_id)
    return Batcher(engine.decoder, engine.tokenizer.decode, sorted(eos), config, controller, observer)


