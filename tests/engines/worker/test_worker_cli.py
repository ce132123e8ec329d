"""The worker CLI and settings: the log level (any case, a clear error for a name `logging` does not
know) and `--engine` naming several modes over one target."""

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


def test_engine_modes_setting() -> None:
    from engines.worker.settings import WorkerSettings

    s = WorkerSettings(engine="mtp, dfly,ar", model="m")
    assert (s.engine, s.modes, s.pool) == ("mtp,dfly,ar", ["mtp", "dfly", "ar"], "mtp+dfly+ar")
    for bad, msg in (("mtp,vllm", "only our own engines"), ("mtp,mtp", "twice"), ("mtp,eagle", "unknown engine 'eagle'")):
        with pytest.raises(ValueError, match=msg):
            WorkerSettings(engine=bad, model="m")
    with pytest.raises(ValueError, match="single-mode worker"):
        WorkerSettings(engine="mtp,dfly", model="m", dcut=True)
    with pytest.raises(ValueError, match="not one of this worker's modes"):
        WorkerSettings(engine="mtp,ar", model="m", degrade_mode="dfly")
    assert WorkerSettings(engine="mtp,dfly", model="m", degrade_mode="dfly").degrade_mode == "dfly"
