"""End to end: real redis-server, real worker processes (`specroute worker`), two real gateway processes
(`specroute gateway`), and the official `openai` client (sync + async, streaming and not).

Uses models/demo when its drafters are trained, else a tiny random bundle (same tokenizer)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from specroute.readiness import grpc_serving, poll_until
from specroute.v1 import engine_pb2, engine_pb2_grpc
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "demo"
ADMIN = "e2e-admin-token-0123"
CHAT = [{"role": "user", "content": "Tell me a short story about a friendly dog."}]
CODE = [{"role": "user", "content": "Write a Python function `def add(a, b):` that returns a + b.\n```python\n"}]


def _bundle(tmp: Path) -> Path:
    if (DEMO / "drafters" / "mtp").is_dir() and (DEMO / "drafters" / "dfly").is_dir():
        return DEMO
    from tests.tiny_bundle import make_tiny_bundle

    return make_tiny_bundle(tmp / "bundle", drafters=("mtp", "dfly"))


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    f = open(log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "specroute.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "SPECROUTE_WORKER_THREADS": "1", **(env or {})},
                            start_new_session=True, cwd=REPO)


def _wait(check: Any, proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float = 300) -> None:
    def alive() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited {proc.returncode}:\n{log.read_text()[-3000:]}")

    if not poll_until(check, timeout, 0.3, alive):
        raise AssertionError(f"{what} not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def _http(url: str, data: Any = None, method: str | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    body = None if data is None else json.dumps(data).encode()
    method = method or ("GET" if data is None else "POST")
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback
            return r.status, json.loads(r.read() or b"null"), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


class System:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.redis = RedisServer().start()
        bundle = _bundle(tmp)
        self.ports = {name: free_port() for name in ("mtp", "dfly", "ar", "gw_a", "gw_b")}
        for engine in ("mtp", "dfly", "ar"):
            self._start(engine, ["worker", "--engine", engine, "--model", str(bundle), "--port",
                                 str(self.ports[engine]), "--redis-url", self.redis.url, "--pool", engine])
        for engine in ("mtp", "dfly", "ar"):
            addr = f"127.0.0.1:{self.ports[engine]}"
            _wait(lambda a=addr: grpc_serving(a), self.procs[engine], engine, self.log(engine))
        pools = ["--pool", f"mtp=127.0.0.1:{self.ports['mtp']}", "--pool", f"dfly=127.0.0.1:{self.ports['dfly']}"]
        for gw in ("gw_a", "gw_b"):
            self._start(gw, ["gateway", "--port", str(self.ports[gw]), *pools, "--redis-url", self.redis.url],
                        env={"SPECROUTE_ADMIN_TOKEN": f"ops:{ADMIN}"})
        for gw in ("gw_a", "gw_b"):
            url = self.url(gw)
            _wait(lambda u=url: _http(u + "/v1/models")[0] == 200, self.procs[gw], gw, self.log(gw), 120)

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.procs[name] = _spawn(args, self.log(name), env)

    def url(self, gw: str) -> str:
        return f"http://127.0.0.1:{self.ports[gw]}"

    def admin(self, gw: str, method: str, path: str, data: Any = None, etag: str | None = None) -> tuple[int, Any, Any]:
        headers = {"authorization": f"Bearer {ADMIN}"}
        if etag:
            headers["if-match"] = etag
        return _http(self.url(gw) + path, data, method, headers)

    def set_policy(self, gw: str, **changes: Any) -> int:
        _, doc, h = self.admin(gw, "GET", "/admin/policy")
        status, new, _ = self.admin(gw, "PUT", "/admin/policy", {**doc, **changes}, h["etag"])
        assert status == 200, new
        return int(new["version"])

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.redis.stop()


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("e2e"))
    try:
        yield s
    finally:
        s.stop()


def _ar_text(addr: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    with grpc.insecure_channel(addr) as ch:
        req = engine_pb2.GenerateRequest(max_tokens=max_tokens, sampling=engine_pb2.SamplingParams(temperature=0))
        for m in messages:
            req.messages.add(role=m["role"], content=m["content"])
        return "".join(c.text for c in engine_pb2_grpc.EngineStub(ch).Generate(req, timeout=120))


def test_openai_client_and_temperature0_equals_ar(system: System) -> None:
    system.set_policy("gw_a", exploration_rate=0.0)
    client = openai.OpenAI(base_url=system.url("gw_a") + "/v1", api_key="unused", max_retries=0, timeout=120)
    models = [m.id for m in client.models.list()]
    for messages in (CHAT, CODE):
        r = client.chat.completions.create(model=models[0], messages=messages, max_tokens=24, temperature=0)
        text = r.choices[0].message.content or ""
        assert r.usage is not None and r.usage.completion_tokens > 0
        assert text == _ar_text(f"127.0.0.1:{system.ports['ar']}", messages, 24)
        stream = client.chat.completions.create(model=models[0], messages=messages, max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
        spec = (chunks[-1].model_extra or {})["specroute"]
        assert spec["pool"] in ("mtp", "dfly") and spec["steps"] > 0

    async def async_calls() -> tuple[str, str]:
        ac = openai.AsyncOpenAI(base_url=system.url("gw_b") + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = await ac.completions.create(model="specroute", prompt="Once upon a time", max_tokens=12, temperature=0)
        s = await ac.completions.create(model="specroute", prompt="Once upon a time", max_tokens=12, temperature=0,
                                        stream=True)
        streamed = "".join([c.choices[0].text async for c in s])
        await ac.close()
        return r.choices[0].text, streamed

    full, streamed = asyncio.run(async_calls())
    assert full == streamed and full


def test_default_routing_follows_the_domain(system: System) -> None:
    system.set_policy("gw_a", exploration_rate=0.0, pins={})
    for messages in (CHAT, CODE, [{"role": "user", "content": "Solve for x: 3x + 5 = 20. Show the steps."}]):
        status, body, h = _http(system.url("gw_a") + "/v1/chat/completions",
                                {"model": "specroute", "messages": messages, "max_tokens": 4})
        assert status == 200, body
        domain, pool, reason = h["x-specroute-domain"], h["x-specroute-pool"], h["x-specroute-reason"]
        if reason == "default":
            assert pool == ("mtp" if domain == "chat" else "dfly")
        else:
            assert reason == "uncertain" and pool == "mtp"


def test_live_policy_reaches_gateway_b_within_one_second(system: System) -> None:
    t0 = time.perf_counter()
    version = system.set_policy("gw_a", pins={"code": "mtp"})
    while time.perf_counter() - t0 < 5:
        if _http(system.url("gw_b") + "/readyz")[1]["policy_version"] == version:
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    assert _http(system.url("gw_b") + "/readyz")[1]["policy_version"] == version
    assert elapsed < 1.0, elapsed
    status, _, h = _http(system.url("gw_b") + "/v1/chat/completions",
                         {"model": "specroute", "messages": CODE, "max_tokens": 2})
    assert status == 200 and (h["x-specroute-reason"] == "pin" or h["x-specroute-domain"] != "code")
    system.set_policy("gw_a", pins={})


def test_worker_killed_mid_stream_migrates_then_fallback(system: System) -> None:
    """A stream whose worker dies continues on the fallback pool from the tokens already sent: the client
    sees no error, and at T=0 the whole text is the target's greedy text (the AR worker's)."""
    system.set_policy("gw_a", pins={"*": "dfly"})
    client = openai.OpenAI(base_url=system.url("gw_a") + "/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="specroute", messages=CHAT, max_tokens=200, stream=True,
                                            temperature=0)
    got, parts = 0, []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            got += 1
            if got == 3:
                system.procs["dfly"].send_signal(signal.SIGKILL)
    assert got > 3
    assert "".join(parts) == _ar_text(f"127.0.0.1:{system.ports['ar']}", CHAT, 200)
    for _ in range(3):  # next requests are served by the healthy pool
        r = client.chat.completions.create(model="specroute", messages=CHAT, max_tokens=4)
        assert r.choices[0].message.content is not None
    status, _, h = _http(system.url("gw_a") + "/v1/chat/completions",
                         {"model": "specroute", "messages": CHAT, "max_tokens": 2})
    assert status == 200 and h["x-specroute-pool"] == "mtp" and h["x-specroute-reason"] == "fallback"
