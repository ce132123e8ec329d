"""`specroute bench engine --engines vllm,...`: the vLLM row, measured like ours.

vLLM's `AsyncLLM` (through our `VllmBackend`, the worker's backend, with its speculation: `--vllm-method`,
ngram by default) runs on an event loop in a background thread; `VllmRunner.submit(request, sink)` has the
batcher's shape, so `bench.engine.run_closed_loop` drives it with the same prompts, closed-loop clients
and timing as our engines. Mean accepted length follows vLLM's convention (1 + accepted drafts / steps
that verified drafts), from the worker metrics the backend feeds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from engines.requests import GenRequest, Sink


class VllmRunner:
    def __init__(self, model_dir: Path, method: str | None, k: int | None, max_running: int, threads: int,
                 drafter: str | None = None, context_length: int | None = None) -> None:
        from engines.worker.metrics import WorkerMetrics
        from engines.worker.settings import WorkerSettings

        self.settings = WorkerSettings(engine="vllm", model=model_dir, vllm_method=method, k=k, vllm_drafter=drafter,
                                       max_running=max_running, max_waiting=4 * max_running + 8, threads=threads,
                                       context_length=context_length)
        self.metrics = WorkerMetrics()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-vllm", daemon=True)
        self.thread.start()
        t0 = time.perf_counter()
        self.backend: Any = asyncio.run_coroutine_threadsafe(self._make(), self.loop).result()
        self.load_s = time.perf_counter() - t0

    async def _make(self) -> Any:
        from engines.worker.vllm_backend import VllmBackend

        return VllmBackend(self.settings, self.metrics)

    @property
    def label(self) -> str:
        i = self.backend.info
        return f"vllm ({i.drafter or 'no speculation'}{f' k={i.block_size}' if i.block_size else ''})"

    def submit(self, request: GenRequest, sink: Sink) -> None:
        self.loop.call_soon_threadsafe(self.backend.submit, request, sink)

    def counters(self) -> dict[str, float]:
        r = self.metrics.registry
        return {"rounds": r.get_sample_value("specroute_spec_decode_num_drafts_total") or 0.0,
                "accepted": r.get_sample_value("specroute_spec_decode_num_accepted_tokens_total") or 0.0}

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.backend.stop)
        time.sleep(1.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.backend = None   # vLLM's AsyncLLM is shut down now, not by its finalizer at interpreter exit


def run_vllm(args: Any, model_dir: Path, prompts: list, concurrencies: list[int], reference: dict[str, list[int]],
             target: Any, notes: list[str]) -> list:
    """One row per concurrency for vLLM (same prompts and settings as our engines' rows)."""
    import sys

    from bench.engine import count_lossless_failures, run_closed_loop, summarize

    runner = VllmRunner(model_dir, args.vllm_method, args.vllm_k, max(concurrencies), args.threads or 1)
    notes.append(f"{runner.label}: engine ready in {runner.load_s:.1f}s (vLLM {vllm_version()}, "
                 f"engine args {runner.backend.engine_kwargs})")
    rows = []
    try:
        run_closed_loop(runner, prompts, 1, 1, 8)   # warm-up
        for c in concurrencies:
            n = args.requests or max(2 * c, 8)
            before = runner.counters()
            reqs, wall = run_closed_loop(runner, prompts, c, n, args.max_tokens)
            after = runner.counters()
            rounds, accepted = after["rounds"] - before["rounds"], after["accepted"] - before["accepted"]
            mal = 1.0 + accepted / rounds if rounds else 1.0
            steps = sum(r.stats.acceptance.steps for r in reqs if r.stats is not None)
            row = summarize("vllm", False, c, reqs, wall, 1.0, mal, rounds / steps if steps else 0.0)
            if reference and target is not None:
                row.lossless_failures = count_lossless_failures(target, reqs, reference)
            rows.append(row)
            print(f"bench engine: vllm c={c}: {row.output_tokens_per_s:.1f} tok/s, ttft p50 {row.ttft_p50_ms:.0f} ms, "
                  f"MAL {row.mean_accepted_length:.2f}"
                  + (f", lossless failures {row.lossless_failures}" if row.lossless_failures is not None else ""),
                  file=sys.stderr, flush=True)
    finally:
        runner.stop()
    return rows


def vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except ImportError:
        return "?"
