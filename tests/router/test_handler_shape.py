"""The completion handler reads as a short flow (admit -> route -> open -> respond): no function of
router/api/completions.py or router/api/admit.py is over 60 lines or takes more than 5 positional
arguments."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "router" / "api"


@pytest.mark.parametrize("name", ["completions.py", "admit.py"])
def test_no_long_function_and_few_positional_arguments(name: str) -> None:
    tree = ast.parse((API / name).read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            positional = [a for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
            if lines > 60 or len(positional) > 5:
                bad.append(f"{node.name}: {lines} lines, {len(positional)} positional arguments")
    assert not bad, bad
