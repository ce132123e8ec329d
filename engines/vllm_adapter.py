"""`--engine vllm`: run vLLM's async engine behind our gRPC contract (GPU machines).

    pip install 'specroute[vllm]'
    specroute worker --engine vllm --model Qwen/Qwen3-8B --vllm-method mtp --k 3 --port 50051
    specroute worker --engine vllm --model Qwen/Qwen3-8B --vllm-method dflash \
        --vllm-drafter z-lab/Qwen3-8B-DFlash-b16 --block-size 16 --port 50052

The pure functions here (option mapping to `speculative_config` and engine/sampling kwargs, and
vLLM's per-request speculative statistics to ours) are unit-tested on any machine; `VllmBackend`
imports vllm lazily and only runs where vLLM does. See deploy/vllm/README.md.

vLLM has no DFly method: serve DFly through our own engine (`--engine dfly`), or a DFlash-format
checkpoint through vLLM's `dflash` method.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from engines.requests import Event, GenRequest, LoadSnapshot, RequestStats, Sink
from engines.worker.backend import AsyncTaskBackend, BackendInfo, TaskHandle
from specroute.contracts.stats import AcceptanceStats
from specroute.errors import UserError

VLLM_METHODS = ("mtp", "dflash")
DEFAULT_MTP_K = 3
DEFAULT_BLOCK_SIZE = 16


def speculative_config(method: str | None, k: int | None = None, drafter: str | None = None,
                       block_size: int | None = None) -> dict[str, Any] | None:
    """Our options -> vLLM `speculative_config` (None: plain decoding).

    mtp:    {"method": "mtp", "num_speculative_tokens": k}      (drafter head inside the target checkpoint)
    dflash: {"method": "dflash", "model": drafter, "num_speculative_tokens": block_size - 1}
    """
    if method in (None, "", "ar", "none"):
        return None
    if method == "mtp":
        n = DEFAULT_MTP_K if k is None else int(k)
        if n < 1:
            raise UserError(f"mtp needs k >= 1 draft tokens, got {n}")
        return {"method": "mtp", "num_speculative_tokens": n}
    if method == "dflash":
        if not drafter:
            raise UserError("vllm dflash needs a drafter checkpoint (--vllm-drafter PATH_OR_HF_ID)")
        b = DEFAULT_BLOCK_SIZE if block_size is None else int(block_size)
        n = (b - 1) if k is None else int(k)
        if n < 1:
            raise UserError(f"dflash needs block size >= 2, got {b}")
        return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": n}
    if method == "dfly":
        raise UserError("vLLM has no DFly method; serve DFly with --engine dfly (our engine) "
                        "or a DFlash-format checkpoint with --vllm-method dflash")
    raise UserError(f"unknown vLLM speculative method {method!r} (expected one of {', '.join(VLLM_METHODS)})")


def engine_kwargs(settings) -> dict[str, Any]:
    """WorkerSettings -> `vllm.AsyncEngineArgs(**kwargs)`."""
    method = settings.vllm_method or ("dflash" if settings.vllm_drafter else "mtp")
    kw: dict[str, Any] = {
        "model": str(settings.model),
        "max_num_seqs": settings.max_running,
        "gpu_memory_utilization": settings.vllm_gpu_memory_utilization,
        "tensor_parallel_size": settings.vllm_tensor_parallel_size,
        "disable_log_stats": False,
    }
    if settings.context_length:
        kw["max_model_len"] = settings.context_length
    spec = speculative_config(method, settings.k, settings.vllm_drafter, settings.block_size)
    if spec is not None:
        kw["speculative_config"] = spec
    return kw


def sampling_kwargs(req: GenRequest) -> dict[str, Any]:
    """Our request -> `vllm.SamplingParams(**kwargs)` (delta outputs for streaming)."""
    p = req.params
    kw: dict[str, Any] = {
        "temperature": float(p.temperature),
        "top_p": float(p.top_p),
        "max_tokens": int(req.max_tokens),
        "stop": list(req.stop) or None,
        "seed": p.seed,
        "skip_special_tokens": True,
    }
    return kw


def stats_from_vllm(spec: Any, prompt_tokens: int = 0, completion_tokens: int = 0) -> RequestStats:
    """vLLM's per-request speculative summary (`--per-request-spec-decode-metrics summary`: a mapping or
    object with num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram where
    histogram[j] = steps that accepted exactly j drafts) -> our RequestStats. Missing -> zeros."""
    def get(name: str, default: Any = 0) -> Any:
        if spec is None:
            return default
        if isinstance(spec, Mapping):
            return spec.get(name, default)
        return getattr(spec, name, default)

    hist = [int(x) for x in (get("acceptance_histogram", None) or [])]
    steps = int(get("num_spec_steps", 0) or (sum(hist) if hist else 0))
    accepted = int(get("num_accepted_draft_tokens", 0) or sum(j * h for j, h in enumerate(hist)))
    drafted = int(get("num_draft_tokens", 0))
    per_pos = [sum(hist[j] for j in range(i + 1, len(hist))) for i in range(max(0, len(hist) - 1))]
    return RequestStats(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        acceptance=AcceptanceStats(drafted, accepted, steps, per_pos))


def find_spec_metrics(output: Any) -> Any:
    """Where vLLM versions put per-request speculative stats (None when the server does not report them)."""
    for path in (("outputs", 0, "spec_decode_metrics"), ("metrics", "speculative_decoding"),
                 ("spec_decode_metrics",)):
        cur = output
        for step in path:
            if cur is None:
                break
            if isinstance(step, int):
                cur = cur[step] if isinstance(cur, Sequence) and len(cur) > step else None
            elif isinstance(cur, Mapping):
                cur = cur.get(step)
            else:
                cur = getattr(cur, step, None)
        if cur is not None:
            return cur
    return None


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """vLLM Prometheus spec-decode counters (names without the `vllm:` prefix and `_total`) -> our names."""
    names = {"spec_decode_num_drafts": "num_drafts", "spec_decode_num_draft_tokens": "num_draft_tokens",
             "spec_decode_num_accepted_tokens": "num_accepted_tokens"}
    return {ours: float(after.get(theirs, 0.0)) - float(before.get(theirs, 0.0)) for theirs, ours in names.items()}


FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


class VllmBackend(AsyncTaskBackend):  # pragma: no cover - needs a GPU and vllm
    def __init__(self, settings, metrics=None) -> None:
        try:
            from transformers import AutoTokenizer
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise UserError(f"--engine vllm needs vLLM on a GPU machine: pip install 'specroute[vllm]' ({exc})") from None
        kw = engine_kwargs(settings)
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        self.tokenizer = AutoTokenizer.from_pretrained(str(settings.model))
        self.metrics = metrics
        self.max_running, self.max_waiting = settings.max_running, settings.max_waiting
        spec = kw.get("speculative_config") or {}
        self.info = BackendInfo(model_id=str(settings.model), engine="vllm", drafter=spec.get("method", ""),
                                block_size=int(spec.get("num_speculative_tokens", 0)),
                                max_context=int(settings.context_length or self.tokenizer.model_max_length),
                                max_running=settings.max_running, max_waiting=settings.max_waiting)
        self._active: set[TaskHandle] = set()
        self._closed = False
        self._n = 0

    def tokenize(self, messages, prompt: str) -> list[int]:
        if messages:
            return list(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True))
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def submit(self, request: GenRequest, sink: Sink) -> TaskHandle:
        self._admit()
        self._n += 1
        h = TaskHandle(request, sink, request.request_id or f"req-{self._n}")
        self._active.add(h)
        h.task = asyncio.get_running_loop().create_task(self._run(h))
        return h

    async def _run(self, h: TaskHandle) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        req = h.request
        params = SamplingParams(**sampling_kwargs(req), output_kind=RequestOutputKind.DELTA)
        n, t_first = 0, 0.0
        try:
            async for out in self.llm.generate({"prompt_token_ids": req.prompt_ids}, params, h.request_id):
                c = out.outputs[0]
                ids = list(c.token_ids)
                n += len(ids)
                if ids and not t_first:
                    t_first = time.perf_counter()
                if out.finished:
                    stats = stats_from_vllm(find_spec_metrics(out), len(req.prompt_ids), n)
                    stats.ttft_s, stats.wall_s = t_first - h.submitted, time.perf_counter() - h.submitted
                    self._observe(stats)
                    h.sink(Event(ids, c.text, time.perf_counter(),
                                 FINISH_REASONS.get(c.finish_reason or "stop", "stop"), stats))
                    return
                h.sink(Event(ids, c.text, time.perf_counter()))
        except asyncio.CancelledError:
            await self.llm.abort(h.request_id)
            h.sink(Event([], "", time.perf_counter(), "cancelled", RequestStats(completion_tokens=n)))
        except Exception as exc:
            h.sink(Event([], "", time.perf_counter(), "error", None, f"vllm: {type(exc).__name__}: {exc}"))
        finally:
            self._active.discard(h)

    def _observe(self, s: RequestStats) -> None:
        if self.metrics is not None:
            self.metrics.on_tokens(s.completion_tokens)
            self.metrics.on_request_acceptance(s.acceptance)

    def stop(self) -> None:
        super().stop()
        self.llm.shutdown()

    def load(self) -> LoadSnapshot:
        return self._snapshot(0.0)
