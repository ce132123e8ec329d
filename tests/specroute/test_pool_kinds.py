"""Pool kinds describe themselves (specroute/pools.py): a new kind is one `PoolKind` line plus its
engine, and the launcher, the built-in policy, the gateway's notion of speculation and the routing
benchmark's fleets follow it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.routing.policy import default_policy
from specroute import pools
from specroute.pools import PoolKind, register
from specroute.readiness import free_port, http_ok, poll_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kinds() -> Iterator[None]:
    saved = list(pools.POOL_KINDS)
    yield
    pools.POOL_KINDS[:] = saved


def test_every_list_of_pools_derives_from_the_kinds(kinds: None) -> None:
    pol = default_policy(["mtp", "dfly", "ar"])
    assert (pol.defaults, pol.safe_pool) == ({"chat": "mtp", "code": "dfly", "math": "dfly"}, "mtp")
    register(PoolKind("eagle", defaults={"math": -1}, speculative=True, fleet=True, serve=True))
    register(PoolKind("plain2", engine="ar", speculative=False))
    assert default_policy(["mtp", "dfly", "eagle"]).defaults["math"] == "eagle"
    assert pools.non_speculative() == frozenset({"ar"})
    assert pools.fleets()["all-eagle"] == "eagle"
    assert [k.name for k in pools.served()] == ["mtp", "dfly", "eagle"]
    from specroute.serve import build_parser, pool_kinds

    args = build_parser().parse_args(["--pools", "eagle", "--eagle-port", "5"])
    assert [k.name for k in pool_kinds(args.pools)] == ["eagle"] and args.eagle_port == 5


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_throwaway_kind_is_served_by_specroute_serve(tmp_path: Path) -> None:
    """`specroute serve --pools echo` after one `register` line: a worker of the kind's engine (the
    `null` test double) comes up as pool `echo`, and the gateway routes a chat completion to it."""
    code = ("import sys; from specroute.pools import PoolKind, register; "
            "register(PoolKind('echo', engine='null', serve=True)); "
            "from specroute.cli import main; sys.exit(main(sys.argv[1:]))")
    port = free_port()
    env = {**os.environ, "SPECROUTE_ADMIN_TOKEN": "t" * 24}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--model", str(REPO / "models" / "demo"),
                             "--pools", "echo", "--port", str(port), "--status-file", str(tmp_path / "status.json")],
                            cwd=REPO, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def alive() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"specroute serve exited with {proc.returncode}")

    try:
        assert poll_until(lambda: http_ok(base + "/readyz"), 240, 0.5, alive)
        req = urllib.request.Request(base + "/v1/chat/completions", method="POST", data=json.dumps(
            {"model": "specroute", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}).encode(),
            headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
            assert r.headers["x-specroute-pool"] == "echo"
        assert body["specroute"]["pool"] == "echo" and body["usage"]["completion_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
