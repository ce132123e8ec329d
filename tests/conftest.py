"""Session-wide test setup: the suite reads its prompt data from `tests/data`, never from beside the repo.

`SPECROUTE_DATA_DIR` is pointed at the fixture data set in the repository (`tests/data`, see its
README) for the whole session, before collection, so every test (and every process a test starts)
sees the same small, held-out-style prompt set whether or not a full data folder exists. A test that
wants other data sets the variable itself (`monkeypatch.setenv`) or passes a folder explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.demo import Demo

TEST_DATA = Path(__file__).resolve().parent / "data"
TEST_PROMPTS = TEST_DATA / "prompts"

_saved: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    _saved["SPECROUTE_DATA_DIR"] = os.environ.get("SPECROUTE_DATA_DIR")
    os.environ["SPECROUTE_DATA_DIR"] = str(TEST_DATA)


def pytest_unconfigure(config: pytest.Config) -> None:
    old = _saved.pop("SPECROUTE_DATA_DIR", None)
    if old is None:
        os.environ.pop("SPECROUTE_DATA_DIR", None)
    else:
        os.environ["SPECROUTE_DATA_DIR"] = old


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The fixture data folder (`prompts/*.jsonl`) that `SPECROUTE_DATA_DIR` names during the session."""
    return TEST_DATA


@pytest.fixture(scope="session")
def demo() -> Demo:
    """The real demo bundle (`models/demo`: target + tokenizer), loaded once for the whole session, with
    memoised greedy references (tests/demo.py). Skips the requesting test when it is not trained."""
    import torch

    from tests.demo import load_demo

    torch.set_num_threads(1)
    return load_demo()
