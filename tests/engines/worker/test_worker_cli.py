"""The worker CLI's log level: any case, a clear error for a name `logging` does not know."""

from __future__ import annotations

import pytest

from engines.worker.cli import log_level
from specroute.errors import UserError


@pytest.mark.parametrize(("value", "level"), [(None, "INFO"), ("", "INFO"), ("warning", "WARNING"),
                                              ("Debug", "DEBUG"), (" error ", "ERROR")])
def test_log_level_accepts_any_case(value: str | None, level: str) -> None:
    assert log_level(value) == level


def test_unknown_log_level_is_a_user_error() -> None:
    with pytest.raises(UserError, match="SPECROUTE_LOG_LEVEL='loud'"):
        log_level("loud")
