"""One torch thread for every engine test: the suite runs on 2 cores beside other work, where a second
intra-op thread per process only thrashes (and some tests run CLIs that set their own thread count:
this puts it back before every test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    torch.set_num_threads(1)
    yield
