"""Named API keys with limits (router/keys/ring.py, router/keys/ratelimit.py, router/keys/store.py): per-key
requests- and tokens-per-minute in Redis with 429 + Retry-After, fail-open when Redis is down, pool
and domain allow-lists, key names in metrics and the access log, and the admin API to list and change
keys (secrets never returned) with its audit log."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, RateLimitError

from router.keys.ring import KeyLimits, StoredKey, build_ring, secret_hash
from tests.redis_server import RedisServer
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(60)
ASYNC = pytest.mark.asyncio(loop_scope="session")
CODE = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 4}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def test_ring_merges_static_and_stored_keys() -> None:
    ring = build_ring({"a": "sk-a-0123456789abcdef-static", "b": "sk-b-0123456789abcdef"}, {"a": KeyLimits(rpm=5)},
                      {"a": StoredKey(tpm=100),
                       "c": StoredKey(secret_hmac=secret_hash("sk-c-0123456789abcdef", b"k"), disabled=True)}, b"k")
    a = ring.lookup("sk-a-0123456789abcdef-static")
    assert a is not None and a.name == "a" and a.source == "static+stored"
    assert (a.limits.rpm, a.limits.tpm) == (None, 100)  # the stored entry overrides the static limits
    assert ring.lookup("sk-b-0123456789abcdef") is not None and ring.lookup("sk-b-0123456789abcdef").limits == KeyLimits()  # type: ignore[union-attr]
    assert ring.lookup("sk-c-0123456789abcdef") is None  # disabled
    assert ring.lookup("nope") is None and ring.lookup(None) is None
    assert "secret" not in json.dumps([k.public() for k in ring.keys.values()])


@ASYNC
async def test_rpm_limit_gives_429_with_retry_after_and_key_metrics(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    async with engines(FakeConfig()) as es, running_app(settings_for(
        {"mtp": [es[0].address]}, redis_url, api_keys="team-a:sk-a-0123456789abcdef,team-b:sk-b-0123456789abcdef",
        api_key_limits='{"team-a": {"rpm": 2}}', access_log=True, access_log_file=log,
        metrics_key_names=True)
    ) as c:
        for _ in range(2):
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-a-0123456789abcdef"))).status_code == 200
        r = await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-a-0123456789abcdef"))
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        # another key is not affected; the official client sees a RateLimitError
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-b-0123456789abcdef"))).status_code == 200
        oa = AsyncOpenAI(api_key="sk-a-0123456789abcdef", base_url="http://gateway/v1", http_client=c, max_retries=0)
        with pytest.raises(RateLimitError):
            await oa.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
        m = (await c.get("/metrics")).text
        assert 'specroute_rate_limited_total{key="team-a",limit="rpm"} 2.0' in m
        assert 'specroute_key_requests_total{key="team-a",status="200"} 2.0' in m
        assert 'specroute_key_requests_total{key="team-a",status="429"} 2.0' in m
        assert 'specroute_key_requests_total{key="team-b",status="200"} 1.0' in m
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["key"], x["status"]) for x in lines][:3] == [("team-a", 200), ("team-a", 200), ("team-a", 429)]


@ASYNC
async def test_tpm_limit_reserves_and_then_counts_finished_tokens(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for(
        {"mtp": [es[0].address]}, redis_url, api_keys="t:sk-t-0123456789abcdef", api_key_limits='{"t": {"tpm": 10}}')
    ) as c:
        statuses = []
        for _ in range(3):
            statuses.append((await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-t-0123456789abcdef"))).status_code)
            await asyncio.sleep(0.1)  # the tokens are charged in the background
        # 3 (prompt estimate) + 4 reserved, 6 charged: 6 + 7 > 10
        assert statuses == [200, 429, 429]


@ASYNC
async def test_redis_down_fails_open_with_a_metric() -> None:
    with RedisServer() as r:
        async with engines(FakeConfig()) as es, running_app(settings_for(
            {"mtp": [es[0].address]}, r.url, api_keys="a:sk-a-0123456789abcdef", api_key_limits='{"a": {"rpm": 1}}')
        ) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-a-0123456789abcdef"))).status_code == 200
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-a-0123456789abcdef"))).status_code == 429
            r.stop()
            t = time.perf_counter()
            for _ in range(3):
                assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-a-0123456789abcdef"))).status_code == 200
            assert time.perf_counter() - t < 2.0  # one failed try, then no waiting on Redis
            m = (await c.get("/metrics")).text
            assert "specroute_rate_limit_fail_open_total 3.0" in m


@ASYNC
async def test_key_limited_to_pools_and_domains(redis_url: str) -> None:
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(settings_for(
        {"mtp": [es[0].address], "dfly": [es[1].address]}, redis_url, api_keys="p:sk-p-0123456789abcdef,d:sk-d-0123456789abcdef",
        api_key_limits='{"p": {"pools": ["mtp"]}, "d": {"domains": ["chat"]}}')
    ) as c:
        r = await c.post("/v1/chat/completions", json=CODE, headers=bearer("sk-p-0123456789abcdef"))  # code -> dfly by default
        assert r.status_code == 200 and r.headers["x-specroute-pool"] == "mtp"
        assert r.headers["x-specroute-domain"] == "code"
        r = await c.post("/v1/chat/completions", json=CODE, headers=bearer("sk-d-0123456789abcdef"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "domain_not_allowed"
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-d-0123456789abcdef"))).status_code == 200


@ASYNC
async def test_admin_lists_and_changes_keys_everywhere_with_audit(redis_url: str) -> None:
    async with engines(FakeConfig()) as es:
        s = settings_for({"mtp": [es[0].address]}, redis_url, api_keys="static:sk-static-0123456789")
        async with running_app(s) as c, running_app(s) as c2:
            secret = "sk-new-key-0123456789"
            r = await c.put("/admin/keys/team-x", json={"rpm": 100, "pools": ["mtp"]}, headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] == "secret"  # a new key needs one
            r = await c.put("/admin/keys/team-x", json={"secret": secret, "rpm": 100, "pools": ["mtp"]}, headers=ADMIN)
            assert r.status_code == 200 and r.json()["rpm"] == 100
            assert (await c.put("/admin/keys/team-x", json={"secret": secret}, headers=bearer("wrong"))).status_code == 401
            listing = await c.get("/admin/keys", headers=ADMIN)
            assert {k["name"] for k in listing.json()["keys"]} == {"static", "team-x"}
            assert secret not in listing.text and "sha256" not in listing.text
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))).status_code == 200

            async def works_on(client: httpx.AsyncClient, want: int) -> None:
                t_end = time.monotonic() + 3
                while (await client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))).status_code != want:
                    assert time.monotonic() < t_end
                    await asyncio.sleep(0.05)

            await works_on(c2, 200)  # the other gateway picks the key up from Redis
            # limits change without the secret
            r = await c.put("/admin/keys/team-x", json={"rpm": 5}, headers=ADMIN)
            assert r.status_code == 200 and r.json()["pools"] == []
            assert (await c.delete("/admin/keys/team-x", headers=ADMIN)).status_code == 204
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))).status_code == 401
            await works_on(c2, 401)
            assert (await c.delete("/admin/keys/static", headers=ADMIN)).status_code == 404
            audit = (await c.get("/admin/audit", headers=ADMIN)).json()["entries"]
            assert [(e["action"], e["key"], e["actor"]) for e in audit] == [
                ("key:delete", "team-x", "ops"), ("key:put", "team-x", "ops"), ("key:put", "team-x", "ops")]
            assert audit[2]["secret_changed"] is True and audit[1]["secret_changed"] is False
            assert secret not in json.dumps(audit)
