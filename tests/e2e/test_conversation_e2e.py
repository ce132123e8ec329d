"""Conversations end to end: a real redis-server, two real worker processes over the demo bundle
(each serving the `mtp` and `dfly` modes, so each pool has two endpoints), a real gateway and the
official `openai` client. Each conversation, identified by its history (no id at all) or by an
`x-conversation-id` header, has all its turns served by one worker (`x-specroute-worker`), also when
a turn's own domain would send it elsewhere (reason `conversation`: switching gains less, by the
policy's estimates, than prefilling the history again); an operator pin moves it.

Our engine has no prefix cache (engines/slots.py prefills each request's whole prompt into its
slot), so the sticky worker prefills the history too: this test shows the affinity, not a prefill
saving. Cost on two cores shared at load 7-10: setup 33-70 s (two workers load the demo bundle beside
the gateway), the test 13-15 s, teardown 9-10 s."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from specroute.readiness import grpc_serving
from tests.e2e.test_gateway_e2e import ADMIN, CHAT, CODE, _bundle, _http, _spawn, _wait
from tests.redis_server import RedisServer, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
MODES = ("mtp", "dfly")


def _pools_up(url: str) -> bool:
    """Every endpoint of both pools healthy (the gateway's health loop has seen both workers)."""
    status, pools, _ = _http(url + "/admin/pools", headers={"authorization": f"Bearer {ADMIN}"})
    return status == 200 and all(p["available_endpoints"] == 2 for p in pools.values())


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.redis = RedisServer().start()
        bundle = _bundle(tmp)
        ports = [free_port(), free_port()]
        self.procs = [_spawn(["worker", "--engine", ",".join(MODES), "--model", str(bundle), "--port", str(p),
                              "--redis-url", self.redis.url], tmp / f"worker{i}.log") for i, p in enumerate(ports)]
        addrs = [f"127.0.0.1:{p}" for p in ports]
        gw = free_port()   # the gateway starts beside the workers and finds them healthy once they serve
        pools = [x for m in MODES for x in ("--pool", f"{m}={','.join(addrs)}", "--pool-mode", f"{m}={m}")]
        self.procs.append(_spawn(["gateway", "--port", str(gw), *pools, "--redis-url", self.redis.url],
                                 tmp / "gw.log", env={"SPECROUTE_ADMIN_TOKEN": f"ops:{ADMIN}"}))
        for i, a in enumerate(addrs):
            _wait(lambda a=a: grpc_serving(a), self.procs[i], f"worker {i}", tmp / f"worker{i}.log")
        self.url = f"http://127.0.0.1:{gw}"
        _wait(lambda: _http(self.url + "/readyz")[0] == 200 and _pools_up(self.url), self.procs[-1], "gateway",
              tmp / "gw.log", 120)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def policy(self, **changes: Any) -> None:
        h = {"authorization": f"Bearer {ADMIN}"}
        _, doc, rh = _http(self.url + "/admin/policy", headers=h)
        status, body, _ = _http(self.url + "/admin/policy", {**doc, **changes}, "PUT", {**h, "if-match": rh["etag"]})
        assert status == 200, body
        time.sleep(0.2)

    def turn(self, messages: list[dict[str, str]], conversation: str | None = None) -> tuple[dict[str, str], str]:
        raw = self.client.chat.completions.with_raw_response.create(
            model="specroute", messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
            extra_headers={"x-conversation-id": conversation} if conversation else None)
        return dict(raw.headers), raw.parse().choices[0].message.content or ""

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            p.wait(20)
        self.redis.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("conv"))
    try:
        yield f
    finally:
        f.stop()


def test_turns_of_a_conversation_land_on_one_worker(fleet: Fleet) -> None:
    # the built-in policy (chat -> mtp, code and math -> dfly), without exploration or learning's detours
    fleet.policy(exploration_rate=0.0, uncertainty_threshold=1.0, learning={"enabled": False})
    default = {"chat": "mtp", "code": "dfly", "math": "dfly"}
    served: dict[str, list[tuple[str, str]]] = {}
    for name in ("history", "header"):
        conv = "conv-e2e-1" if name == "header" else None
        msgs = [{"role": "system", "content": f"You are assistant {name}."}, *CHAT]
        for t, follow_up in enumerate([CODE[0]["content"], "Thanks. And once more, please.", "Now in one line."]):
            h, answer = fleet.turn(msgs, conv)
            where = served.setdefault(name, [])
            where.append((h["x-specroute-pool"], h["x-specroute-worker"]))
            if t > 0 or conv:
                assert h["x-specroute-conversation"] == ("new" if t == 0 else "stay"), h
            if t > 0 and default.get(h["x-specroute-domain"], "mtp") != where[0][0]:
                # the turn's domain would go to another pool: it stays where the conversation began
                assert h["x-specroute-reason"] == "conversation", h
            msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
        assert len(set(served[name])) == 1, served  # one pool, one worker, every turn
    # an operator pin moves a conversation: its next turn switches
    other = "dfly" if served["header"][0][0] == "mtp" else "mtp"
    fleet.policy(pins={"chat": other, "code": other, "math": other})
    h, _ = fleet.turn([{"role": "user", "content": "hello"}], "conv-e2e-1")
    assert (h["x-specroute-conversation"], h["x-specroute-pool"], h["x-specroute-reason"]) == ("switch", other, "pin")
