"""The security review's findings (issue 35), one test each: secrets compared as bytes, static token
rules, keyed key hashes and unique secrets, the rate limiter's declared (hash-tagged) Redis key and
its tokens-per-minute reservation, JSON-only bodies and cross-site refusals, the dashboard's CSP,
Redis credentials kept off argv and the status file, key names on `/metrics` opt-in, and the brake
on admin password guessing."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
import redis

from router.keys.ratelimit import RateLimiter
from router.keys.ring import ApiKey, KeyLimits, StoredKey, build_ring, secret_hash
from router.observability.metrics import Metrics
from router.settings import Settings
from router.state.store import PolicyStore
from tests.router.conftest import ADMIN, engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(60)
ASYNC = pytest.mark.asyncio(loop_scope="session")
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
KEY = "sk-team-0123456789abcdef"


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@ASYNC
async def test_non_ascii_authorization_is_a_recorded_401() -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, None,
                                                                     api_keys=f"team:{KEY}")) as c:
        weird = {"authorization": "Bearer caf\xe9-\xff-token-0123456789".encode("latin-1")}
        r = await c.get("/admin/policy", headers=weird)  # type: ignore[arg-type]
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token"
        assert "specroute_admin_auth_failures_total 1.0" in (await c.get("/metrics")).text
        r = await c.post("/v1/chat/completions", json=CHAT, headers=weird)  # type: ignore[arg-type]
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("value", ["short", "ops:short", "not a name:abcdefghijklmnopqrstuvwxyz",
                                   ":abcdefghijklmnopqrstuvwxyz", "a:abcdefghijklmnop,b:abcdefghijklmnop"])
def test_weak_or_ambiguous_static_tokens_are_refused_at_startup(value: str) -> None:
    with pytest.raises(ValueError):
        Settings(api_keys=value)
    with pytest.raises(ValueError):
        Settings(admin_tokens=value)


def test_key_hashes_are_keyed_unique_and_old_hashes_are_refused() -> None:
    h1, h2 = secret_hash(KEY, b"one"), secret_hash(KEY, b"two")
    assert h1 != h2 and hashlib.sha256(KEY.encode()).hexdigest() not in (h1, h2)
    old = StoredKey(secret_sha256=hashlib.sha256(b"sk-old-0123456789abcdef").hexdigest())
    ring = build_ring({"a": KEY, "b": KEY}, {}, {"old": old}, b"k")
    a = ring.lookup(KEY)
    assert a is not None and a.name == "a" and len(ring.by_hash) == 1  # b shares a's secret: refused
    assert ring.lookup("sk-old-0123456789abcdef") is None and "old" in ring.keys  # unsalted: refused


@ASYNC
async def test_admin_refuses_a_secret_another_key_has(redis_url: str) -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, redis_url,
                                                                     api_keys=f"team:{KEY}")) as c:
        r = await c.put("/admin/keys/other", json={"secret": KEY}, headers=ADMIN)
        assert r.status_code == 400 and "another key" in r.json()["error"]["message"]
        stored = redis.Redis.from_url(redis_url).hgetall("{specroute}:keys")
        assert stored == {}
        r = await c.put("/admin/keys/other", json={"secret": "sk-other-0123456789abcdef"}, headers=ADMIN)
        assert r.status_code == 200
        entry = redis.Redis.from_url(redis_url).hget("{specroute}:keys", "other")
        assert entry is not None and b"secret_hmac" in entry
        assert hashlib.sha256(b"sk-other-0123456789abcdef").hexdigest().encode() not in entry


@ASYNC
async def test_rate_limit_script_touches_only_its_declared_hash_tagged_key(redis_url: str) -> None:
    store = PolicyStore(redis_url)
    limiter = RateLimiter(store, Metrics())
    key = ApiKey("team", KeyLimits(rpm=100, tpm=1000), "static")
    for _ in range(3):
        assert (await limiter.admit(key, 10)).admitted
    names = redis.Redis.from_url(redis_url).keys("*")
    assert names == [b"specroute:rl:{team}"]  # one key, declared in KEYS; Redis Cluster routes it
    await store.close()


@ASYNC
async def test_tokens_per_minute_are_reserved_at_admission(redis_url: str) -> None:
    async with engines(FakeConfig(token_delay_s=0.05)) as es, running_app(settings_for(
            {"mtp": [es[0].address]}, redis_url, api_keys=f"t:{KEY}", api_key_limits='{"t": {"tpm": 12}}')) as c:
        body = {**CHAT, "max_tokens": 8}  # 3 prompt (estimate) + 8: one fits in 12, two do not
        rs = await asyncio.gather(*[c.post("/v1/chat/completions", json=body, headers=bearer(KEY)) for _ in range(3)])
        assert sorted(r.status_code for r in rs) == [200, 429, 429]


@ASYNC
async def test_bodies_must_be_json_and_cross_site_admin_is_refused() -> None:
    async with engines(FakeConfig()) as es, running_app(settings_for({"mtp": [es[0].address]}, None,
                                                                     admin_tokens="", insecure_admin=True)) as c:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"content-type": ctype} if ctype else {}
            r = await c.post("/v1/chat/completions", content=b'{"model": "x"}', headers=headers)
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
            r = await c.post("/admin/policy/rollback", content=b'{"version": 1}', headers=headers)
            assert r.status_code == 415
        ok = {"content-type": "application/json; charset=utf-8"}
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=ok)).status_code == 200
        for foreign in ({"sec-fetch-site": "cross-site"}, {"origin": "http://evil.example"}):
            r = await c.post("/admin/policy/rollback", json={"version": 1}, headers=foreign)
            assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site_request"
        r = await c.post("/admin/policy/rollback", json={"version": 1}, headers={"origin": "http://gateway"})
        assert r.status_code != 403


@ASYNC
async def test_dashboard_has_a_content_security_policy() -> None:
    async with running_app(settings_for({}, None)) as c:
        r = await c.get("/dashboard")
        csp = r.headers["content-security-policy"]
        script_src = next(p for p in csp.split(";") if p.strip().startswith("script-src"))
        assert "'unsafe-inline'" not in script_src and "'sha256-" in script_src
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp


@ASYNC
async def test_key_names_on_metrics_are_opt_in() -> None:
    for opt_in in (False, True):
        async with engines(FakeConfig()) as es, running_app(settings_for(
                {"mtp": [es[0].address]}, None, api_keys=f"team-secret-name:{KEY}", metrics_key_names=opt_in)) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=bearer(KEY))).status_code == 200
            m = (await c.get("/metrics")).text
            assert ('key="team-secret-name"' in m) is opt_in and ('key="redacted"' in m) is not opt_in


@ASYNC
async def test_failed_admin_logins_back_off() -> None:
    async with running_app(settings_for({}, None)) as c:
        for _ in range(5):
            assert (await c.get("/admin/policy", headers=bearer("wrong-token-0123456789"))).status_code == 401
        r = await c.get("/admin/policy", headers=ADMIN)  # even the right token waits now
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_failed_logins"
        assert int(r.headers["retry-after"]) >= 1
        await asyncio.sleep(1.1)
        assert (await c.get("/admin/policy", headers=ADMIN)).status_code != 429  # and a success clears it
        assert (await c.get("/admin/policy", headers=bearer("wrong-token-0123456789"))).status_code == 401


def test_serve_keeps_redis_credentials_off_argv_and_the_status_file(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    from specroute import serve

    url = "redis://:hunter2-password@10.0.0.1:6379/0"
    specs: list[Any] = []

    class Sup:
        info: dict[str, Any] = {}
        settings = type("S", (), {"drain_timeout_s": 1.0})()
        status_file = tmp_path / "status.json"

        def add(self, spec: Any) -> Any:
            specs.append(spec)
            return type("C", (), {"spec": spec})()

    monkeypatch.setattr(serve, "_wait", lambda *a, **k: None)
    args = serve.build_parser().parse_args(["--model", str(tmp_path), "--redis-url", url])
    sup = Sup()
    serve.start_all(args, sup, tmp_path)  # type: ignore[arg-type]
    assert specs and all("hunter2" not in " ".join(s.args) for s in specs)
    assert "hunter2" not in str(sup.info) and sup.info["redis_url"] == "redis://:***@10.0.0.1:6379/0"
    assert all(url in s.env.values() for s in specs)  # the children get it in their environment
