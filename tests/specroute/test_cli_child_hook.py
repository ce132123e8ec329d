"""specroute/cli.py's child hook: a spawned child runs the function `SPECROUTE_CHILD_HOOK` names (how the vLLM
backend gets its corrections into vLLM's engine core), also when its parent was started by the console
script; nothing without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specroute.cli import CHILD_HOOK_ENV, run_child_hook

REPO = Path(__file__).resolve().parents[2]
CALLS: list[str] = []


def mark() -> None:
    CALLS.append("called")


def test_child_hook_runs_the_named_function(monkeypatch: pytest.MonkeyPatch) -> None:
    CALLS.clear()
    monkeypatch.delenv(CHILD_HOOK_ENV, raising=False)
    run_child_hook()
    assert CALLS == []
    monkeypatch.setenv(CHILD_HOOK_ENV, f"{__name__}:mark")
    run_child_hook()
    assert CALLS == ["called"]


LAUNCHER = """import multiprocessing, os, sys
from specroute.cli import main  # what pip's `specroute` console script does
if __name__ == "__main__":
    os.environ["SPECROUTE_CHILD_HOOK"] = "hook_target:mark"
    child = multiprocessing.get_context("spawn").Process(target=print, args=("child",))
    child.start()
    child.join()
    sys.exit(child.exitcode)
"""


def test_a_child_spawned_from_the_console_script_runs_the_hook(tmp_path: Path) -> None:
    """vLLM spawns its engine core from a worker started as `specroute worker` (the console script, as in
    the containers), whose main module is not specroute.cli: the child still runs the hook."""
    (tmp_path / "hook_target.py").write_text(
        "import os\ndef mark():\n    open(os.environ['HOOK_OUT'], 'a').write(f'{os.getpid()}\\n')\n")
    (tmp_path / "specroute_script").write_text(LAUNCHER)
    out = tmp_path / "calls"
    env = {**os.environ, "HOOK_OUT": str(out), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    env.pop(CHILD_HOOK_ENV, None)
    subprocess.run([sys.executable, str(tmp_path / "specroute_script")], env=env, check=True, timeout=60)
    assert len(out.read_text().split()) == 1   # once, in the child
