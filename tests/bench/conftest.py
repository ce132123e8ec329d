"""One torch thread for every benchmark test (the benchmarks run in-process here, beside other work on
2 cores, where a second intra-op thread per process only thrashes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    torch.set_num_threads(1)
    yield
