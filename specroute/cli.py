"""`specroute` console script: a thin dispatcher.

Each top-level command lives in the package that owns it and is imported lazily, so
`specroute gateway` never imports torch and `specroute worker` never imports FastAPI.
A command module exposes `main(argv: list[str]) -> int`.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import sys

from specroute.errors import UserError

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("specroute.serve", "start Redis, an MTP worker, a DFly worker and the gateway"),
    "gateway": ("router.cli", "run the OpenAI-compatible gateway"),
    "worker": ("engines.worker.cli", "run a gRPC engine worker"),
    "generate": ("engines.cli_generate", "one-off generation with acceptance stats"),
    "model": ("engines.importer", "import a model (HF folder, GGUF, packaged file) as a bundle"),
    "train": ("engines.training.cli", "train tokenizer, target or drafters"),
    "classifier": ("classifier.cli", "train / evaluate the request classifier"),
    "redis": ("specroute.redis_url", "Redis maintenance: `redis migrate` moves keys to the hash-tagged names"),
    "bench": ("bench.cli", "benchmarks writing bench/results/*.json"),
    "sim": ("bench.sim.cli", "simulate a fleet behind the gateway's policy (what-if, calibration, Hy3 check)"),
}


# set by a process whose helpers must not outlive it (the vLLM backend, before vLLM spawns its engine core)
DIE_WITH_PARENT_ENV = "SPECROUTE_DIE_WITH_PARENT"
# "module:function" a spawned child runs on start (the vLLM backend: corrections to vLLM's CPU kernels
# in its engine core, engines/vllm_cpu_fixes.py)
CHILD_HOOK_ENV = "SPECROUTE_CHILD_HOOK"
CHILD_STARTED_ENV = "SPECROUTE_CHILD_STARTED"   # the pid of the child that ran `child_started`


def die_with_parent_if_asked() -> None:
    """Linux: a process spawned by the one named in `SPECROUTE_DIE_WITH_PARENT` gets SIGTERM when that
    one dies, even by SIGKILL. vLLM starts its engine core with multiprocessing's spawn, which imports the
    parent's main module (this one) as `__mp_main__` in the child: that import is the hook. Only direct
    children (the engine core, not the workers it spawns in turn, which watch the engine core themselves)."""
    want = os.environ.get(DIE_WITH_PARENT_ENV, "")
    if not want.isdigit() or os.getppid() != int(want) or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != int(want):   # the parent died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)


def child_started() -> None:
    """In a multiprocessing child of a `specroute` process, once: `die_with_parent_if_asked`, then
    `run_child_hook`. A spawned child imports its parent's main module: this module as `__mp_main__`
    under `python -m specroute.cli`, or the `specroute` console script, which imports this module by
    name (how containers start workers): both land here."""
    if os.environ.get(CHILD_STARTED_ENV) == str(os.getpid()):
        return
    os.environ[CHILD_STARTED_ENV] = str(os.getpid())
    die_with_parent_if_asked()
    run_child_hook()


def run_child_hook() -> None:
    """In a multiprocessing child: call the function `SPECROUTE_CHILD_HOOK` names ("module:function")."""
    target = os.environ.get(CHILD_HOOK_ENV, "")
    if ":" in target:
        module, _, fn = target.partition(":")
        getattr(importlib.import_module(module), fn)()


def _usage() -> str:
    lines = ["usage: specroute COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"specroute: error: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except UserError as exc:
        print(f"specroute {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
elif __name__ == "__mp_main__" or getattr(multiprocessing.current_process(), "_inheriting", False):
    child_started()   # a spawned child, importing its parent's main module (multiprocessing.spawn.prepare)
