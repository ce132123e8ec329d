"""grpc.aio servicer for `protos/specroute/v1/engine.proto` over any `Backend`.

Generate: validate and tokenize in the worker, submit to the backend with a thread-safe sink that
feeds an asyncio queue, and stream a chunk as soon as an event arrives; events that are already
queued behind it (the engine got ahead of the stream) go in the same chunk, so a busy worker sends
fewer, larger deltas and never waits for more (`ready_events`). With `coalesce` (set by
non-streaming callers) the first chunk goes out at once, then one final chunk carries every later
delta. A client that goes away
(cancel, disconnect, deadline) cancels the handler task; the `finally` cancels the request in the
batcher, which frees its slot at once. The final chunk carries the request's speculative statistics,
and a feedback record goes to Redis through the background writer (specroute/feedback_writer.py).
`Complete` is the unary form for callers that read the answer whole: one message, the final chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import specroute
from engines.errors import EngineError, check_room
from engines.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from engines.requests import Closed, Event, GenRequest, Handle, QueueFull
from engines.sampling import SamplingParams
from engines.worker.structured import StructuredError, chat_messages, constraint_of, tools_of
from specroute.contracts.context import temperature_bucket
from specroute.contracts.feedback import build_record
from specroute.contracts.limits import over_context, too_long_message
from specroute.errors import UserError
from specroute.feedback_writer import FeedbackWriter
from specroute.v1 import engine_pb2 as pb
from specroute.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("specroute.worker")

SERVICE = "specroute.v1.Engine"
TOKENIZE_INLINE_BYTES = 4096  # larger requests are validated and tokenized in a thread, off the event loop
ABORT_CODES = {
    "cancelled": grpc.StatusCode.CANCELLED,
    "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
    "shutdown": grpc.StatusCode.UNAVAILABLE,
    "error": grpc.StatusCode.INTERNAL,
}


def traceparent(context: grpc.aio.ServicerContext) -> str:
    """The caller's W3C trace context (`traceparent` metadata, sent by a tracing gateway), or "-"."""
    for k, v in context.invocation_metadata() or ():
        if k == "traceparent":
            return str(v)[:64]
    return "-"


class InvalidRequest(ValueError):
    pass


def sampling_from_pb(s: pb.SamplingParams) -> SamplingParams:
    t, p = float(s.temperature), float(s.top_p)
    if not math.isfinite(t) or t < 0 or t > 100:
        raise InvalidRequest(f"temperature must be in [0, 100], got {t:g}")
    if not math.isfinite(p) or p < 0 or p > 1:
        raise InvalidRequest(f"top_p must be in [0, 1] (0 or 1 disables it), got {p:g}")
    return SamplingParams(temperature=t, top_p=1.0 if p == 0 else p,
                          seed=int(s.seed) if s.has_seed else None)


def build_request(r: pb.GenerateRequest, backend, default_max_tokens: int, deadline: float | None) -> GenRequest:
    """Validate + tokenize. Raises InvalidRequest with a one-line message."""
    if r.messages and r.prompt:
        raise InvalidRequest("give either messages or prompt, not both")
    try:
        messages, tools = chat_messages(r.messages), tools_of(r)
    except StructuredError as exc:
        raise InvalidRequest(str(exc)) from None
    if not messages and not r.prompt:
        raise InvalidRequest("empty prompt")
    params = sampling_from_pb(r.sampling)
    if r.logprobs:
        if not getattr(backend, "supports_logprobs", False):
            raise InvalidRequest(f"logprobs are not supported by this worker (engine {backend.info.engine})")
        if not 0 <= r.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {r.top_logprobs}")
        params = replace(params, logprobs=r.top_logprobs)
    if r.max_tokens < 0:
        raise InvalidRequest(f"max_tokens must be positive, got {r.max_tokens}")
    if len(r.stop) > 16 or any(len(s) > 256 for s in r.stop) or any(not s for s in r.stop):
        raise InvalidRequest("stop: at most 16 non-empty strings of at most 256 characters")
    n_bytes = over_context([m.content for m in r.messages] or [r.prompt], backend.info.max_context)
    if n_bytes is not None:  # cannot fit, whatever the tokenizer makes of it: refused before tokenizing
        raise InvalidRequest(too_long_message(n_bytes, backend.info.max_context))
    try:
        ids = backend.tokenize(messages, r.prompt, tools) if tools else backend.tokenize(messages, r.prompt)
    except UserError as exc:
        raise InvalidRequest(str(exc)) from None
    ctx = backend.info.max_context
    try:
        check_room(len(ids), ctx)
    except EngineError as exc:
        raise InvalidRequest(str(exc)) from None
    max_tokens = min(r.max_tokens or default_max_tokens, ctx - len(ids))
    prefix = list(r.prefix_token_ids)
    if prefix:  # a continuation: generate after the tokens another worker produced
        vocab = backend.info.vocab_size or 1 << 31
        if len(prefix) >= max_tokens or r.prefix_chars < 0 or any(not 0 <= t < vocab for t in prefix):
            raise InvalidRequest("prefix_token_ids: the continuation's tokens do not fit the request")
        ids, max_tokens = ids + prefix, max_tokens - len(prefix)
    if r.mode and r.mode not in backend.info.mode_names():
        raise InvalidRequest(f"mode {r.mode!r} is not served by this worker (modes: {', '.join(backend.info.mode_names())})")
    try:
        constraint = constraint_of(r, backend, prefix)
    except StructuredError as exc:
        raise InvalidRequest(str(exc)) from None
    return GenRequest(prompt_ids=ids, params=params, max_tokens=max_tokens, stop=tuple(r.stop),
                      request_id=r.request_id, deadline=deadline, disable_dcut=r.disable_dcut,
                      domain=r.domain, pool=r.pool, context=r.context, features=tuple(r.features), mode=r.mode,
                      temperature_bucket=r.temperature_bucket or temperature_bucket(params.temperature),
                      prefix_len=len(prefix), prefix_chars=r.prefix_chars, constraint=constraint)


def ready_events(ev: Event, q: asyncio.Queue[Event]) -> list[Event]:
    """`ev` and the events already queued behind it, through the request's last one (never waits)."""
    evs = [ev]
    while not ev.finish_reason and not q.empty():
        ev = q.get_nowait()
        evs.append(ev)
    return evs


Piece = Callable[[int], tuple[str, bytes]]   # a token id's text and bytes (the backend's tokenizer)


def chunk_of(evs: list[Event], piece: Piece | None = None) -> pb.GenerateChunk:
    """One chunk with the deltas of `evs` (their text, token ids and logprobs, in order)."""
    if len(evs) == 1:
        ev = evs[0]
        chunk = pb.GenerateChunk(text=ev.text, num_tokens=len(ev.token_ids), token_ids=ev.token_ids)
    else:
        ids = [t for ev in evs for t in ev.token_ids]
        chunk = pb.GenerateChunk(text="".join(ev.text for ev in evs), num_tokens=len(ids), token_ids=ids)
    if piece is not None:
        chunk.logprobs.extend(logprob_pb(lp, piece) for ev in evs for lp in ev.logprobs or ())
    return chunk


def logprob_pb(lp: TokenLogprob, piece: Piece) -> pb.TokenLogprob:
    """An emitted token's logprob on the wire, with its text and bytes and those of its top tokens."""
    def one(token_id: int, logprob: float) -> pb.TokenLogprob:
        text, data = piece(token_id)
        return pb.TokenLogprob(token_id=token_id, token=text, token_bytes=data, logprob=logprob)
    out = one(lp.token_id, lp.logprob)
    out.top.extend(one(t, v) for t, v in lp.top)
    return out


def stats_pb(ev: Event) -> pb.SpecStats:
    if ev.stats is None:
        return pb.SpecStats()
    s = ev.stats.acceptance
    return pb.SpecStats(drafted_tokens=s.drafted, accepted_tokens=s.accepted, steps=s.steps,
                        mean_accepted_length=s.mean_accepted_length,
                        accepted_per_position=s.accepted_per_position, steps_by_drafter=s.steps_by)


class EngineService(pb_grpc.EngineServicer):
    def __init__(self, backend, settings, metrics=None, feedback=None) -> None:
        self.backend = backend
        self.settings = settings
        self.metrics = metrics
        self.feedback = feedback
        self.piece: Piece | None = getattr(backend, "token_piece", None)

    async def _start(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
                     ) -> tuple[GenRequest, asyncio.Queue[Event], Handle]:
        """Validate and tokenize `request` and submit it; its events arrive on the queue (aborts the
        call with INVALID_ARGUMENT, RESOURCE_EXHAUSTED or UNAVAILABLE)."""
        remaining = context.time_remaining()
        deadline = time.monotonic() + remaining if remaining is not None else None
        try:
            args = (request, self.backend, self.settings.max_tokens_default, deadline)
            # a long prompt takes a while to tokenize: not on the loop that streams everyone's tokens
            if request.ByteSize() > TOKENIZE_INLINE_BYTES:
                req = await asyncio.to_thread(build_request, *args)
            else:
                req = build_request(*args)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Event] = asyncio.Queue()
        loop_thread = threading.get_ident()

        def sink(ev: Event) -> None:
            # a backend on the loop (null, vLLM) queues its events directly; one with its own thread
            # (the batcher) hands them over (each backend emits a request's events from one thread)
            if threading.get_ident() == loop_thread:
                q.put_nowait(ev)
            else:
                loop.call_soon_threadsafe(q.put_nowait, ev)

        try:
            handle = self.backend.submit(req, sink)
        except QueueFull as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Closed as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return req, q, handle

    async def Complete(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateChunk:
        """The whole answer as one message: `Generate`'s final chunk with every delta merged in."""
        req, q, handle = await self._start(request, context)
        finished = False
        evs: list[Event] = []
        try:
            while True:
                ev = await q.get()
                evs.append(ev)
                if ev.finish_reason:
                    break
            finished = True
            if ev.finish_reason in ABORT_CODES:
                await self._abort(req, ev, context)
            chunk = chunk_of(evs, self.piece)
            self._finish(chunk, req, ev, context)
            if ev.stats is not None:
                chunk.ttft_ms = ev.stats.ttft_s * 1000.0
            return chunk
        finally:
            if not finished:
                self.backend.cancel(handle)

    async def _abort(self, req: GenRequest, ev: Event, context: grpc.aio.ServicerContext) -> None:
        msg = ev.error or {"cancelled": "request cancelled", "deadline": "deadline exceeded",
                           "shutdown": "worker shut down before the request finished"}.get(
                               ev.finish_reason, "engine error")
        log.warning("request %s ended: %s", req.request_id or "-", msg)
        await context.abort(ABORT_CODES[ev.finish_reason], msg)

    def _finish(self, chunk: pb.GenerateChunk, req: GenRequest, ev: Event, context: grpc.aio.ServicerContext) -> None:
        """Make `chunk` the request's final one (finish reason, token counts, statistics) and record it."""
        # one line per request at debug level (SPECROUTE_LOG_LEVEL=debug): a busy worker's log
        # stays quiet by default; failed requests are logged with their id at warning level
        if log.isEnabledFor(logging.DEBUG):  # (its arguments cost more than the check)
            log.debug("request %s finished (%s): %d prompt + %d completion tokens, domain %s, "
                      "trace %s", req.request_id or "-", ev.finish_reason, len(req.prompt_ids),
                      ev.stats.completion_tokens if ev.stats is not None else 0, req.domain or "-",
                      traceparent(context))
        chunk.finish_reason = ev.finish_reason
        chunk.prompt_tokens = len(req.prompt_ids)
        if ev.stats is not None:
            chunk.completion_tokens = ev.stats.completion_tokens
            chunk.cached_prompt_tokens = ev.stats.cached_prompt_tokens
            chunk.stats.CopyFrom(stats_pb(ev))
            if self.feedback is not None:
                st, acc = ev.stats, ev.stats.acceptance
                self.feedback.put(build_record(
                    request_id=req.request_id, pool=req.pool or self.settings.pool, domain=req.domain,
                    context=req.context, engine=req.mode or self.backend.info.engine, tokens=st.completion_tokens,
                    counts=(acc.drafted, acc.accepted, acc.steps), wall_s=st.wall_s, ttft_s=st.ttft_s,
                    features=req.features))

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[pb.GenerateChunk]:
        req, q, handle = await self._start(request, context)
        finished = False
        first = True
        # coalesce (non-streaming callers): after the first chunk, hold deltas back for the final one
        coalesce = request.coalesce
        held: list[Event] = []
        try:
            while True:
                evs = ready_events(await q.get(), q)
                ev = evs[-1]
                if ev.finish_reason in ABORT_CODES:
                    finished = True
                    if len(evs) > 1 and (first or not coalesce):  # the deltas before it still go out
                        chunk = chunk_of(evs[:-1], self.piece)
                        if first:
                            chunk.prompt_tokens = len(req.prompt_ids)
                        yield chunk
                    await self._abort(req, ev, context)
                if coalesce and not first:
                    held += evs
                    if not ev.finish_reason:
                        continue
                    evs = held
                chunk = chunk_of(evs, self.piece)
                if first:
                    chunk.prompt_tokens = len(req.prompt_ids)
                    first = False
                if ev.finish_reason:
                    finished = True
                    self._finish(chunk, req, ev, context)
                    yield chunk
                    return
                yield chunk
        finally:
            if not finished:
                self.backend.cancel(handle)

    def _info(self) -> pb.InfoResponse:
        i = self.backend.info
        return pb.InfoResponse(model_id=i.model_id, engine=i.engine, drafter=i.drafter, block_size=i.block_size,
                               max_context=i.max_context, max_running=i.max_running,
                               max_waiting=i.max_waiting, dcut=self.backend.dcut_enabled,
                               version=specroute.__version__, compute_bound_tokens=i.compute_bound_tokens,
                               modes=[pb.EngineMode(engine=m.engine, drafter=m.drafter, block_size=m.block_size)
                                      for m in i.modes])

    async def Info(self, request: pb.InfoRequest, context) -> pb.InfoResponse:
        return self._info()

    async def Load(self, request: pb.LoadRequest, context) -> pb.LoadResponse:
        s = self.backend.load()
        return pb.LoadResponse(running=s.running, waiting=s.waiting, cache_usage=s.cache_usage,
                               tokens_per_s=s.tokens_per_s, mean_accepted_length=s.mean_accepted_length,
                               max_running=s.max_running, dcut_enabled=self.backend.dcut_enabled,
                               kept_ratio=self.backend.kept_ratio)

    async def SetDcut(self, request: pb.SetDcutRequest, context) -> pb.InfoResponse:
        on = self.backend.set_dcut(request.enabled)
        if request.enabled and not on:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "D-Cut is not available on this worker (start it with --dcut and a drafter)")
        log.info("D-Cut %s", "enabled" if on else "disabled")
        return self._info()


async def serve(settings, backend, metrics=None, on_ready=None) -> None:
    """Run until SIGTERM/SIGINT, then drain: stop admitting, let running requests finish (bounded by
    `drain_timeout_s`), end the rest with UNAVAILABLE, stop the server."""
    feedback = None
    if settings.redis_url:
        feedback = FeedbackWriter.from_url(
            settings.redis_url, maxsize=settings.feedback_queue,
            on_error=(lambda _exc: metrics.redis_errors.inc()) if metrics else (lambda _exc: None),
            on_written=metrics.feedback_written.inc if metrics else (lambda: None))
        feedback.start()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_EngineServicer_to_server(EngineService(backend, settings, metrics, feedback), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    if port == 0:
        raise UserError(f"cannot bind {settings.host}:{settings.port}")
    await server.start()
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    from engines.worker.degrade import install as install_drafter_faults

    install_drafter_faults(settings, backend, loop)
    log.info("worker %s listening on %s:%d", settings.engine, settings.host, port)
    if on_ready is not None:
        on_ready(port)
    await stop.wait()
    log.info("draining")
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    backend.close()
    t_end = time.monotonic() + settings.drain_timeout_s
    while time.monotonic() < t_end:
        s = backend.load()
        if s.running == 0 and s.waiting == 0:
            break
        await asyncio.sleep(0.05)
    await asyncio.get_running_loop().run_in_executor(None, backend.stop)
    await asyncio.sleep(0.05)   # let the last chunks / aborts go out
    await server.stop(grace=2.0)
    if feedback is not None:
        await feedback.close()
