"""`specroute worker`: one process = one engine = one pool member.

    specroute worker --engine dfly --dcut --model models/demo --port 50052 --metrics-port 9102 \
        --redis-url redis://127.0.0.1:6379/0 --pool dfly

Every flag also reads from the environment (`SPECROUTE_WORKER_<FLAG>`, e.g. SPECROUTE_WORKER_REDIS_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from pydantic import ValidationError

from specroute.errors import UserError

FLAGS: list[tuple[str, dict]] = [
    ("--engine", dict()),   # help lists settings.worker_engines() (derived from the drafter registry)
    ("--model", dict(help="model bundle directory")),
    ("--host", dict()),
    ("--port", dict(type=int)),
    ("--metrics-port", dict(type=int, help="Prometheus side port (off when unset)")),
    ("--max-running", dict(type=int)),
    ("--max-waiting", dict(type=int)),
    ("--max-tokens-default", dict(type=int)),
    ("--context-length", dict(type=int)),
    ("--block-size", dict(type=int, help="block drafters: block size B (drafts B-1 tokens)")),
    ("--k", dict(type=int, help="draft tokens per step")),
    ("--prefill-chunk", dict(type=int)),
    ("--prefill-budget", dict(type=int)),
    ("--dcut-profile-dir", dict()),
    ("--redis-url", dict()),
    ("--pool", dict()),
    ("--threads", dict(type=int)),
    ("--drain-timeout-s", dict(type=float)),
    ("--degrade-drafter-after-s", dict(type=float, help="degrade the drafter this long after start (fault drill; "
                                                        "SIGUSR1 / SIGUSR2 degrade / restore at any time)")),
    ("--degrade-drafter-noise", dict(type=float, help="noise of a degraded drafter, in weight std units (3)")),
    ("--degrade-mode", dict(help="on a multi-mode worker, the mode whose drafter a fault degrades "
                                 "(default: the first mode with a drafter)")),
    ("--null-token-delay-ms", dict(type=float)),
    ("--vllm-drafter", dict()),
    ("--vllm-method", dict()),
    ("--vllm-gpu-memory-utilization", dict(type=float)),
    ("--vllm-tensor-parallel-size", dict(type=int)),
    ("--engine-arg", dict(action="append", metavar="KEY=VALUE",
                          help="vLLM engine argument (repeatable; JSON values), e.g. max_num_batched_tokens=4096")),
    ("--engine-args-file", dict(help="vLLM engine arguments as one JSON object")),
]


def parse_settings(argv: list[str]):
    from engines.worker.settings import WorkerSettings, worker_engines

    ap = argparse.ArgumentParser(prog="specroute worker", description=__doc__.split("\n")[0])
    for flag, kw in FLAGS:
        if flag == "--engine":
            kw = {**kw, "help": " | ".join(worker_engines())}
        ap.add_argument(flag, default=None, **kw)
    ap.add_argument("--dcut", action=argparse.BooleanOptionalAction, default=None,
                    help="adaptive verification depth (D-Cut)")
    args = vars(ap.parse_args(argv))
    given = {k: v for k, v in args.items() if v is not None}
    try:
        return WorkerSettings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "settings"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise UserError(msg if where == "settings" else f"{where}: {msg}") from None


def log_level(value: str | None) -> str:
    """`SPECROUTE_LOG_LEVEL` as `logging` names it, any case (`debug`, `Warning`, ...); default INFO."""
    level = (value or "INFO").strip().upper()
    if level not in logging.getLevelNamesMapping():
        raise UserError(f"SPECROUTE_LOG_LEVEL={value!r}: not a log level (debug, info, warning, error, critical)")
    return level


def main(argv: list[str]) -> int:
    settings = parse_settings(argv)
    logging.basicConfig(level=log_level(os.environ.get("SPECROUTE_LOG_LEVEL")),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    import torch

    torch.set_num_threads(settings.threads)
    from engines.worker.metrics import WorkerMetrics
    from engines.worker.server import serve

    metrics = WorkerMetrics()
    if settings.metrics_port is not None:
        # a vLLM worker also shows vLLM's own `vllm:*` metrics (its Prometheus logger's default registry)
        metrics.serve(settings.metrics_port, settings.host, with_default_registry=settings.engine == "vllm")

    async def run() -> None:
        if settings.engine == "null":
            from engines.worker.null_engine import NullBackend

            backend = NullBackend(settings)
        elif settings.engine == "vllm":
            from engines.worker.vllm_backend import VllmBackend

            backend = VllmBackend(settings, metrics)
        else:
            from engines.worker.backend import LocalBackend

            backend = await asyncio.get_running_loop().run_in_executor(None, LocalBackend, settings, metrics)

        def ready(port: int) -> None:
            print(f"specroute worker {settings.engine} ready on {settings.host}:{port}", flush=True)

        await serve(settings, backend, metrics, on_ready=ready)

    asyncio.run(run())
    return 0
