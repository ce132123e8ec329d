"""One worker process, several engine modes: `specroute worker --engine mtp,dfly,ar` is a member of
three gateway pools (`--pool-mode`), and each pool's requests run in its mode on the same target.

Real redis-server, one real multi-mode worker, one real gateway; the policy pins chat to each pool in
turn. At temperature 0 the three modes answer token for token alike, the `ar` pool drafts nothing and
the speculative ones do; the worker's acceptance feedback lands in Redis under each pool's name."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import Stack
from tests.e2e.test_gateway_e2e import ADMIN, CHAT, _http, _spawn, _wait
from tests.redis_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODES = ("mtp", "dfly", "ar")
ALLOWED = {"mtp": {"mtp", "plain"}, "dfly": {"dfly", "mtp", "plain"}, "ar": {"plain"}}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("modes"), MODES) as s:
        yield s


def test_each_pool_runs_its_mode_on_the_one_worker(shared: Stack) -> None:
    status, pools, _ = shared.admin("GET", "/admin/pools")
    assert status == 200
    text = str(pools)
    for m in MODES:
        assert f"'mode': '{m}'" in text
    texts = {}
    for pool in MODES:
        shared.pin_chat(pool)
        status, body, h = _http(shared.url + "/v1/chat/completions",
                                {"model": "specroute", "messages": CHAT, "max_tokens": 24, "temperature": 0})
        assert status == 200, body
        assert h["x-specroute-pool"] == pool and h["x-specroute-reason"] == "pin"
        spec = body["specroute"]
        assert (spec["drafted_tokens"] == 0) == (pool == "ar"), spec
        # every step drafted by a drafter the mode may use: its own, the narrowest (MTP's) where the
        # worker's cost model narrows a DFly row, or none (plain); an `ar` row never drafts
        by = spec["steps_by_drafter"]
        assert sum(by.values()) == spec["steps"] and set(by) <= ALLOWED[pool], spec
        texts[pool] = body["choices"][0]["message"]["content"]
    assert len(set(texts.values())) == 1, texts
    r = redis.Redis.from_url(shared.redis.url)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entries = r.xrange("{specroute}:feedback")
        seen = {(e[b"pool"].decode(), e[b"engine"].decode()) for _, e in entries}
        if all((m, m) in seen for m in MODES):
            break
        time.sleep(0.2)
    assert all((m, m) in seen for m in MODES), seen


def test_a_pool_whose_mode_the_worker_lacks_is_unavailable(shared: Stack, tmp_path: Path) -> None:
    """A gateway asking the worker for a mode it does not serve marks that pool unhealthy (and says
    why) instead of sending requests that would fail."""
    port = free_port()
    addr = f"127.0.0.1:{shared.worker_ports[0]}"
    gw = _spawn(["gateway", "--port", str(port), "--pool", f"mtp={addr}", "--pool", f"eagle={addr}",
                 "--pool-mode", "eagle=eagle3", "--redis-url", shared.redis.url], tmp_path / "gw2.log",
                env={"SPECROUTE_ADMIN_TOKEN": f"ops:{ADMIN}"})
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(lambda: _http(url + "/v1/models")[0] == 200, gw, "gateway", tmp_path / "gw2.log", 120)
        _, pools, _ = _http(url + "/admin/pools", headers={"authorization": f"Bearer {ADMIN}"})
        text = str(pools)
        assert "does not serve mode 'eagle3'" in text, text
        status, body, h = _http(url + "/v1/chat/completions",
                                {"model": "specroute", "messages": CHAT, "max_tokens": 4, "temperature": 0})
        assert status == 200 and h["x-specroute-pool"] == "mtp", body
    finally:
        gw.terminate()
        gw.wait(20)
