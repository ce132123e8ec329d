"""The structured access log (router/observability/access_log.py): one JSON line per completion request, written
where the fast-path handler finishes; sampled successes, every error; lines written in batches off
the request path; settings, flags, environment."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from router.cli import build_parser, settings_from_args
from router.observability.access_log import AccessLog, Outcome
from router.settings import Settings
from tests.router.conftest import engines, running_app, settings_for, sse_events
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(60)
ASYNC = pytest.mark.asyncio(loop_scope="session")
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 4}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@ASYNC
async def test_one_line_per_request_with_its_decision_and_tokens(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(settings_for(
        {"mtp": [es[0].address], "dfly": [es[1].address]}, None, api_keys="team-a:sk-a-0123456789abcdef",
        access_log=True, access_log_file=path)
    ) as c:
        auth = {"authorization": "Bearer sk-a-0123456789abcdef"}
        r = await c.post("/v1/chat/completions", json=CHAT, headers={**auth, "x-request-id": "req-1"})
        assert r.status_code == 200
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth)
        assert sse_events(r.text)[-1] == "[DONE]"
        streamed_rid = r.headers["x-request-id"]
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer wrong",
                                                                     "x-request-id": "req-3"})
        assert r.status_code == 401 and r.headers["x-request-id"] == "req-3"
    first, second, third = _lines(path)
    assert first["request_id"] == "req-1" and first["key"] == "team-a" and first["status"] == 200
    assert (first["domain"], first["pool"], first["reason"]) == ("code", "dfly", "default")
    assert first["completion_tokens"] == 4 and first["prompt_tokens"] > 0 and first["stream"] is False
    assert first["mean_accepted_length"] > 1 and 0 < first["latency_ms"] < 10_000
    assert first["model"] == "fake-model" and first["kind"] == "chat"
    assert first["constraint"] == "none" and first["temperature"] in ("0", "low", "high")
    assert second["request_id"] == streamed_rid and second["stream"] is True and second["status"] == 200
    assert second["completion_tokens"] == 4
    assert third["status"] == 401 and third["key"] is None and third["domain"] is None
    assert third["constraint"] is None   # not admitted: no context


@ASYNC
async def test_sampling_skips_successes_never_errors(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    async with engines(FakeConfig()) as es, running_app(settings_for(
        {"mtp": [es[0].address]}, None, access_log=True, access_log_sample=0.0, access_log_file=path)
    ) as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await c.post("/v1/chat/completions", json={**CHAT, "model": "nope"})).status_code == 404
    assert [x["status"] for x in _lines(path)] == [404]


def test_sample_share_is_honoured(tmp_path: Path) -> None:
    draws = iter([0.1, 0.3, 0.29, 0.9])
    log = AccessLog(0.3, tmp_path / "a.log", rand=lambda: next(draws))
    for rid in "abcd":
        out = Outcome("chat")
        out.rid, out.status = rid, 200
        log.write(out, 0.001)
    log.close()
    assert [x["request_id"] for x in _lines(tmp_path / "a.log")] == ["a", "c"]


def test_off_by_default_and_set_by_flags_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(pools="a=h:1").access_log is False
    s = settings_from_args(build_parser().parse_args(
        ["--pool", "a=h:1", "--access-log", "--access-log-sample", "0.25", "--access-log-file", "/tmp/x.log"]))
    assert (s.access_log, s.access_log_sample, str(s.access_log_file)) == (True, 0.25, "/tmp/x.log")
    monkeypatch.setenv("SPECROUTE_ACCESS_LOG", "true")
    monkeypatch.setenv("SPECROUTE_ACCESS_LOG_SAMPLE", "0.5")
    s = Settings(pools="a=h:1")
    assert (s.access_log, s.access_log_sample) == (True, 0.5)


@ASYNC
async def test_lines_are_written_in_batches(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    log = AccessLog(1.0, path, flush_s=0.05, max_lines=3)
    for rid in "ab":
        out = Outcome("chat")
        out.rid, out.status = rid, 200
        log.write(out, 0.001)
    assert path.read_bytes() == b""  # held for `flush_s`
    await asyncio.sleep(0.1)
    assert [x["request_id"] for x in _lines(path)] == ["a", "b"]
    for rid in "cde":
        out = Outcome("chat")
        out.rid, out.status = rid, 200
        log.write(out, 0.001)
    assert [x["request_id"] for x in _lines(path)] == ["a", "b", "c", "d", "e"]  # `max_lines` waiting: at once
    log.close()
