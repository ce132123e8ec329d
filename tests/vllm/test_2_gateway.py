"""A vLLM pool behind the gateway, end to end with the official `openai` client: the gateway (real uvicorn)
lists it, routes to it, learns from the feedback vLLM's per-request speculative statistics produce (the
routing-shift test of tests/router/test_admin_and_store.py with a real vLLM pool in place of one fake),
and a vLLM worker killed mid-stream behaves like ours: the stream fails, the next requests go to the
other pool, and vLLM's engine core does not outlive the worker. Runs last: it kills the session's worker.

The other pool is the named test double of tests/router/fake_engine.py: a "dfly" pool whose drafter is
wrong for code (acceptance 0.05, 400 ms steps), writing its feedback to the same Redis."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis

from tests.router.conftest import settings_for
from tests.router.fake_engine import FakeConfig
from tests.router.gateway_thread import GatewayThread
from tests.vllm.conftest import VllmWorker, alive

ADMIN = {"authorization": "Bearer s3cret-admin-token"}
CODE = [{"role": "user", "content": "Write a Python function `def add(a, b):` that returns a + b."}]


def http(url: str, data: Any = None, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback
            raw = r.read()
            return r.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


@pytest.fixture(scope="module")
def gateway(vllm_worker: VllmWorker) -> Iterator[str]:
    redis.Redis.from_url(vllm_worker.redis_url).flushall()   # learning starts from nothing
    bad = FakeConfig(name="dfly", engine="dfly", model_id="demo", acceptance={"code": 0.05}, step_ms=400.0,
                     redis_url=vllm_worker.redis_url)
    gw = GatewayThread(lambda addrs: settings_for({"dfly": addrs, "vllm": [vllm_worker.address]},
                                                  vllm_worker.redis_url, stats_interval_s=0.05), [bad]).start()
    try:
        yield gw.url
    finally:
        gw.stop()


def set_policy(url: str, **changes: Any) -> None:
    _, doc, h = http(url + "/admin/policy", headers=ADMIN)
    status, new, _ = http(url + "/admin/policy", {**doc, **changes}, "PUT", {**ADMIN, "if-match": h["etag"]})
    assert status == 200, new


def test_gateway_lists_and_shows_the_vllm_pool(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)
    cards = {m.id: (m.model_extra or {})["specroute"]["pools"] for m in client.models.list()}
    assert {"pool": "vllm", "engine": "vllm", "drafter": "ngram"} in cards["demo"], cards
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, pools, _ = http(gateway + "/admin/pools", headers=ADMIN)
        if status == 200 and pools["vllm"]["healthy"] and pools["vllm"]["endpoints"][0]["info"]:
            break
        time.sleep(0.1)
    info = pools["vllm"]["endpoints"][0]["info"]
    assert (info["engine"], info["drafter"], info["model_id"]) == ("vllm", "ngram", "demo"), pools
    set_policy(gateway, exploration_rate=0.0, pins={"*": "vllm"})
    r = client.chat.completions.create(model="demo", messages=CODE, max_tokens=12, temperature=0)
    spec = (r.model_extra or {})["specroute"]
    assert spec["pool"] == "vllm" and spec["steps"] > 0 and r.choices[0].message.content
    stream = client.chat.completions.create(model="demo", messages=CODE, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == r.choices[0].message.content
    _, metrics, _ = http(gateway + "/metrics")
    assert 'pool="vllm"' in metrics
    set_policy(gateway, pins={})


def test_routing_shifts_code_traffic_to_the_vllm_pool(gateway: str, vllm_worker: VllmWorker) -> None:
    """dfly (the default for code) accepts 5% of its drafts in 400 ms steps; vLLM's ngram pool, measured
    from the feedback its worker writes (vLLM's per-request statistics and timings), does better: after
    a bounded number of requests the gateway sends code to vLLM ("learned")."""
    set_policy(gateway, exploration_rate=0.25, pins={},
               learning={"min_samples": 3, "evidence_per_request": 8.0})
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)
    decisions: list[tuple[str, str]] = []
    for _ in range(40):
        raw = client.chat.completions.with_raw_response.create(model="demo", messages=CODE, max_tokens=8,
                                                               temperature=0)
        decisions.append((raw.headers["x-specroute-pool"], raw.headers["x-specroute-reason"]))
        time.sleep(0.05)   # the feedback reaches the snapshot
    learned = [i for i, (p, why) in enumerate(decisions) if why == "learned" and p == "vllm"]
    tail = decisions[-10:]
    share = sum(p == "vllm" for p, _ in tail) / len(tail)
    print(f"routing shift to vLLM: first learned at request {learned[0] if learned else None}; "
          f"vLLM share of the last 10: {share:.1f}; {decisions}")
    assert learned and learned[0] <= 30
    assert share >= 0.7
    _, stats, _ = http(gateway + "/admin/stats", headers=ADMIN)
    cells = {(c["domain"], c["pool"]): c for c in stats["cells"]}
    print(f"code cells: vllm {cells[('code', 'vllm')]}; dfly {cells[('code', 'dfly')]}")
    assert cells[("code", "vllm")]["n"] >= 3 and cells[("code", "dfly")]["acceptance_rate"] < 0.1


def test_a_conversation_stays_on_its_vllm_worker_and_reads_its_history_from_the_prefix_cache(gateway: str) -> None:
    """Two turns of one conversation (identified by its history): the second stays on the worker of the
    first (`x-specroute-conversation: stay`) and that worker, with vLLM's prefix caching, reads the
    history it prefilled on the first turn from its cache: `usage.prompt_tokens_details.cached_tokens`
    covers most of the first turn's prompt, where the first turn itself (a system prompt never sent
    before) read almost nothing from it."""
    set_policy(gateway, exploration_rate=0.0, pins={"*": "vllm"})
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)
    system = f"You are the assistant of session {time.time_ns()}. " + "Answer briefly and keep to the topic. " * 40
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}, *CODE]
    raw = client.chat.completions.with_raw_response.create(model="demo", messages=msgs, max_tokens=8, temperature=0)
    first = raw.parse()
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    msgs += [{"role": "assistant", "content": first.choices[0].message.content or ""},
             {"role": "user", "content": "Now the same for three numbers."}]
    raw2 = client.chat.completions.with_raw_response.create(model="demo", messages=msgs, max_tokens=8, temperature=0)
    second = raw2.parse()
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached1, cached2 = first.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens_details.cached_tokens
    print(f"prefix cache: turn 1 read {cached1} of {first.usage.prompt_tokens} prompt tokens from the cache, "
          f"turn 2 {cached2} of {second.usage.prompt_tokens}")
    assert (raw2.headers["x-specroute-conversation"], raw2.headers["x-specroute-worker"]) == \
        ("stay", raw.headers["x-specroute-worker"])
    assert cached1 is not None and cached2 is not None
    assert cached1 < first.usage.prompt_tokens // 4   # (at most the chat template's opening blocks)
    assert cached2 >= first.usage.prompt_tokens // 2
    set_policy(gateway, pins={})


def test_vllm_worker_killed_mid_stream_migrates_then_fallback(gateway: str, vllm_worker: VllmWorker) -> None:
    """A stream whose vLLM worker dies continues on the pool that is left, from the tokens already sent:
    the client sees no error."""
    set_policy(gateway, exploration_rate=0.0, pins={"*": "vllm"})
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)
    # greedy on a raw prompt: this model loops until max_tokens, so the stream is surely still running
    # when the worker dies (a sampled chat answer may end after a few tokens, depending on the CPU)
    raw = client.completions.with_raw_response.create(model="demo", prompt="Once upon a time", max_tokens=600,
                                                      stream=True, temperature=0.0)
    assert raw.headers["x-specroute-pool"] == "vllm", raw.headers
    # the stream has started (status, headers and the first token are out): kill the worker now, while
    # vLLM is seconds from the end of a 600-token answer (waiting for later events let a fast CPU finish
    # the whole answer into the gateway's buffers before the kill landed)
    vllm_worker.proc.send_signal(signal.SIGKILL)
    got, finish = 0, None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].text:
            got += 1
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert got >= 1 and finish in ("length", "stop")
    set_policy(gateway, pins={})
    for _ in range(3):   # the next requests are served by the pool that is left
        raw = client.chat.completions.with_raw_response.create(model="demo", messages=CODE, max_tokens=4)
        assert raw.headers["x-specroute-pool"] == "dfly"
    deadline = time.monotonic() + 90   # vLLM's engine core and its worker die with the worker (SIGTERM: slow on a busy CPU)
    while time.monotonic() < deadline and any(alive(p) for p in vllm_worker.helpers):
        time.sleep(0.2)
    assert vllm_worker.helpers and not [p for p in vllm_worker.helpers if alive(p)], "vLLM processes outlived the worker"
