"""specroute/cli.py's child hook: a spawned child runs the function `SPECROUTE_CHILD_HOOK` names (how the vLLM
backend gets its corrections into vLLM's engine core); nothing without one."""

from __future__ import annotations

import pytest

from specroute.cli import CHILD_HOOK_ENV, run_child_hook

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
