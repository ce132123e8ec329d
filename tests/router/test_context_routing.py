"""The request context end to end: on the wire (proto round trip, the OpenAI body's buckets), in the
pool state (`ar` pools, D-Cut drafting) and through the gateway with fake workers writing feedback,
where code at T=0 and code at T=1, and free code and code under a JSON schema, learn to go to
different pools."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
import redis

from router.api.openai_wire import gateway_record, generate_request
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.routing.decide import Decision
from router.workers.endpoint import Endpoint
from router.workers.pools import speculation
from specroute.contracts.context import GLOBAL_LEVEL, RequestContext, request_context
from specroute.contracts.feedback import CONTEXT_INDEX, stats_key
from specroute.v1 import engine_pb2
from tests.router.conftest import ADMIN, engines, running_app, settings_for, snapshot_holds
from tests.router.fake_engine import FakeConfig

pytestmark = [pytest.mark.timeout(120)]


def context_of(body: ChatCompletionRequest | CompletionRequest) -> RequestContext:
    texts = body.prompt_texts()
    return request_context(texts, body.temperature, sum(len(t.encode()) for t in texts))


def test_generate_request_context_round_trip() -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Решите уравнение x + 2 = 5"}], "temperature": 0})
    ctx = context_of(body)
    assert ctx == RequestContext("", "cyrillic", "0", "short")
    req = generate_request(body, "rid", Decision("mtp", "math", "default", context=ctx.with_domain("math")))
    wire = engine_pb2.GenerateRequest.FromString(req.SerializeToString())
    assert (wire.domain, wire.context, wire.temperature_bucket) == ("math", "d=math|s=cyrillic|t=0|l=short", "0")
    # an old gateway's request (no field 11) reads as no context
    old = engine_pb2.GenerateRequest(request_id="r", domain="code")
    assert engine_pb2.GenerateRequest.FromString(old.SerializeToString()).context == ""
    # the OpenAI default temperature (absent) is 1: the `high` bucket; size in UTF-8 bytes
    long_prompt = CompletionRequest.model_validate({"model": "m", "prompt": "x" * 9000})
    assert context_of(long_prompt) == RequestContext("", "latin", "high", "long")


def test_gateway_feedback_record_carries_the_context() -> None:
    from router.api.openai_wire import Collected

    d = Decision("dfly", "code", "default", context=RequestContext("code", "latin", "0", "short"))
    rec = gateway_record(d, "dfly", Collected(0.01), 0.1)
    assert rec.context == "d=code|s=latin|t=0|l=short" and rec.domain == "code"


def _endpoint(engine: str, healthy: bool = True, dcut: bool = False, kept: float = 1.0, block: int = 4,
              bound: float = 0.0) -> Endpoint:
    e = Endpoint("p", "127.0.0.1:1", 3, 1.0)
    e.healthy = healthy
    e.info = engine_pb2.InfoResponse(engine=engine, block_size=block, compute_bound_tokens=bound)
    e.load = engine_pb2.LoadResponse(dcut_enabled=dcut, kept_ratio=kept)
    return e


def test_pool_speculation_from_info_and_load() -> None:
    now = time.monotonic()
    assert speculation([_endpoint("ar"), _endpoint("ar")], now) == (False, None, None)
    assert speculation([_endpoint("ar"), _endpoint("dfly")], now) == (True, None, None)
    assert speculation([_endpoint("ar"), _endpoint("dfly", healthy=False)], now) == (False, None, None)
    assert speculation([], now) == (True, None, None)  # nothing known: assume it speculates
    spec, draft_now, bound = speculation([_endpoint("dfly", dcut=True, kept=0.25, block=8, bound=12.0),
                                          _endpoint("dfly", dcut=True, kept=0.75, block=8, bound=18.0),
                                          _endpoint("dfly", dcut=True, kept=0.0, block=8, bound=99.0,
                                                    healthy=False)], now)
    assert spec and draft_now == pytest.approx(4.0)
    assert bound == pytest.approx(15.0)  # measured by the available endpoints; 0 (vLLM) is "not measured"
    assert speculation([_endpoint("vllm"), _endpoint("mtp", bound=20.0)], now)[2] == pytest.approx(20.0)


def _multi(mode: str) -> Endpoint:
    """A member of a pool running `mode` on a worker that serves mtp, dfly and ar over one target."""
    e = Endpoint("p", "127.0.0.1:1", 3, 1.0, mode=mode)
    e.healthy = True
    e.info = engine_pb2.InfoResponse(engine="mtp", block_size=3, modes=[
        engine_pb2.EngineMode(engine="mtp", drafter="mtp", block_size=3),
        engine_pb2.EngineMode(engine="dfly", drafter="dfly", block_size=15),
        engine_pb2.EngineMode(engine="ar", block_size=0)])
    e.load = engine_pb2.LoadResponse(dcut_enabled=True, kept_ratio=0.5)
    return e


def test_a_multi_mode_workers_pools_speak_for_their_mode() -> None:
    now = time.monotonic()
    ar, dfly, default = _multi("ar"), _multi("dfly"), _multi("")
    assert (ar.engine, dfly.engine, default.engine) == ("ar", "dfly", "mtp")
    assert (ar.block_size, dfly.block_size, default.block_size) == (0, 15, 3)
    assert speculation([ar, ar], now)[0] is False                   # the `ar` mode never drafts
    assert speculation([dfly], now)[:2] == (True, pytest.approx(7.5))
    assert all(e.offers_mode(e.info) for e in (ar, dfly, default))   # type: ignore[arg-type]
    assert not _multi("eagle3").offers_mode(ar.info)                 # type: ignore[arg-type]
    # a single-mode worker (no `modes`, e.g. an older one) serves only its own engine
    single = engine_pb2.InfoResponse(engine="dfly")
    assert Endpoint("p", "a:1", 3, 1.0, mode="dfly").offers_mode(single)
    assert not Endpoint("p", "a:1", 3, 1.0, mode="ar").offers_mode(single)


def test_pool_modes_setting() -> None:
    from router.settings import Settings, parse_pool_modes

    assert parse_pool_modes("mtp=mtp; dfly=dfly,ar=ar") == {"mtp": "mtp", "dfly": "dfly", "ar": "ar"}
    assert parse_pool_modes('{"x": "dfly"}') == {"x": "dfly"}
    with pytest.raises(ValueError, match="NAME=MODE"):
        parse_pool_modes("mtp")
    s = Settings(pools="a=127.0.0.1:1;b=127.0.0.1:1", pool_modes="a=mtp;b=ar")
    assert s.pool_modes == {"a": "mtp", "b": "ar"}
    with pytest.raises(ValueError, match="do not exist: c"):
        Settings(pools="a=127.0.0.1:1", pool_modes="c=mtp")
    # the mode goes on the wire with every request to the pool
    req = engine_pb2.GenerateRequest(mode="dfly")
    assert engine_pb2.GenerateRequest.FromString(req.SerializeToString()).mode == "dfly"


HOT_CODE = "write python code that sorts a list"


async def _set_policy(c: httpx.AsyncClient, **changes: object) -> None:
    r = await c.get("/admin/policy", headers=ADMIN)
    doc, etag = r.json(), r.headers["etag"]
    learning = {**doc["learning"], **changes.pop("learning", {})}  # type: ignore[dict-item]
    r = await c.put("/admin/policy", json={**doc, **changes, "learning": learning},
                    headers={**ADMIN, "if-match": etag})
    assert r.status_code == 200, r.text


async def _ask(c: httpx.AsyncClient, temperature: float, **extra: object) -> tuple[str, str]:
    r = await c.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": HOT_CODE}], "max_tokens": 40,
        "temperature": temperature, **extra})
    assert r.status_code == 200, r.text
    return r.headers["x-specroute-pool"], r.headers["x-specroute-reason"]


@pytest.mark.asyncio(loop_scope="session")
async def test_code_at_t0_and_t1_learn_different_pools(redis_url: str) -> None:
    """dfly accepts well at T=0 (MAL 3.8) and hardly at all at T=1 (MAL 1.1); ar runs one token per
    shorter step. After feedback from both pools (pinned in turn, so the evidence is the same on
    every run), code at T=0 stays on dfly and code at T=1 moves to ar."""
    dfly = FakeConfig(name="dfly", engine="dfly", acceptance={"code": 0.7}, hot_acceptance=0.03, step_ms=12.0,
                      redis_url=redis_url)
    ar = FakeConfig(name="ar", engine="ar", block_size=0, step_ms=8.0, redis_url=redis_url)
    async with engines(dfly, ar) as es, running_app(
        settings_for({"dfly": [es[0].address], "ar": [es[1].address]}, redis_url, stats_interval_s=0.05)
    ) as c:
        gw = c.app.state.gateway  # type: ignore[attr-defined]
        assert gw.pools.states()["ar"].speculative is False and gw.pools.states()["dfly"].speculative
        # a request of 40 tokens verifies dozens of drafts: count it as 16 Beta pseudo-counts
        learning = {"min_samples": 3, "evidence_per_request": 16.0}
        for pool, n in (("dfly", 40), ("ar", 20)):  # feedback from both pools, both temperatures
            await _set_policy(c, exploration_rate=0.0, pins={"code": pool}, learning=learning)
            for i in range(n):
                assert await _ask(c, 0.0 if i % 2 else 1.0) == (pool, "pin")
        await _set_policy(c, pins={})
        await snapshot_holds(gw, {"dfly": 40, "ar": 20})
        cold = [await _ask(c, 0.0) for _ in range(10)]
        hot = [await _ask(c, 1.0) for _ in range(10)]
        print(f"T=0 -> {cold}\nT=1 -> {hot}")
        assert cold == [("dfly", "default")] * 10
        assert sum(d == ("ar", "learned") for d in hot) >= 9
        # the worker got the context, and Redis holds its cells (v1 domain cells still written)
        sent = es[1].servicer.requests[-1]
        assert (sent.domain, sent.context) == ("code", "d=code|s=latin|t=high|l=short")
        r = redis.Redis.from_url(redis_url)
        assert float(r.hget(stats_key("d=code|t=high", "dfly"), "n") or 0) >= 19
        assert float(r.hget(stats_key(GLOBAL_LEVEL, "ar"), "n") or 0) >= 19
        assert r.zscore(CONTEXT_INDEX, "d=code|s=latin|t=0|l=short:dfly") is not None
        assert float(r.hget(stats_key("code", "dfly"), "n") or 0) >= 39
        snap = gw.snapshot
        assert ("d=code|t=high", "dfly") in snap.cells and ("code", "dfly") in snap.stats
        assert not any("|" in d for d, _ in snap.stats)  # the dashboard's cells stay per domain
        view = (await c.get("/admin/stats", headers=ADMIN)).json()
        levels = {(x["level"], x["pool"]) for x in view["context_cells"]}
        assert {("*", "ar"), ("d=code|t=high", "dfly")} <= levels
        assert {(x["domain"], x["pool"]) for x in view["cells"]} == {("code", "dfly"), ("code", "ar")}


SCHEMA = {"type": "json_schema", "json_schema": {"name": "sorted", "schema": {
    "type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}}}


async def _ask_json(c: httpx.AsyncClient, schema: bool) -> tuple[str, str]:
    return await _ask(c, 0.0, **({"response_format": SCHEMA} if schema else {}))


@pytest.mark.asyncio(loop_scope="session")
async def test_free_and_schema_constrained_code_learn_different_pools(redis_url: str, tmp_path) -> None:
    """dfly accepts well on free code (MAL 3.8) and hardly at all under a grammar (MAL 1.1); ar runs one
    token per shorter step. With the constraint a context dimension, code under a JSON schema learns to
    go to ar while free code stays on dfly, and the access log and /admin/stats show the dimension."""
    dfly = FakeConfig(name="dfly", engine="dfly", acceptance={"code": 0.7}, constrained_acceptance=0.03,
                      step_ms=12.0, redis_url=redis_url)
    ar = FakeConfig(name="ar", engine="ar", block_size=0, step_ms=8.0, redis_url=redis_url)
    log = tmp_path / "access.log"
    async with engines(dfly, ar) as es, running_app(
        settings_for({"dfly": [es[0].address], "ar": [es[1].address]}, redis_url, stats_interval_s=0.05,
                     access_log=True, access_log_file=log)
    ) as c:
        gw = c.app.state.gateway  # type: ignore[attr-defined]
        learning = {"min_samples": 3, "evidence_per_request": 16.0}
        for pool, n in (("dfly", 40), ("ar", 20)):  # feedback from both pools, free and constrained
            await _set_policy(c, exploration_rate=0.0, pins={"code": pool}, learning=learning)
            for i in range(n):
                assert await _ask_json(c, schema=bool(i % 2)) == (pool, "pin")
        await _set_policy(c, pins={})
        await snapshot_holds(gw, {"dfly": 40, "ar": 20})
        free = [await _ask_json(c, schema=False) for _ in range(10)]
        constrained = [await _ask_json(c, schema=True) for _ in range(10)]
        print(f"free -> {free}\nschema -> {constrained}")
        assert free == [("dfly", "default")] * 10
        assert sum(d == ("ar", "learned") for d in constrained) >= 9
        sent = es[1].servicer.requests[-1]
        assert (sent.domain, sent.context) == ("code", "d=code|s=latin|t=0|l=short|c=json") and sent.grammar
        r = redis.Redis.from_url(redis_url)
        assert float(r.hget(stats_key("d=code|t=0|c=json", "dfly"), "n") or 0) >= 19
        assert float(r.hget(stats_key("d=code|t=0", "dfly"), "n") or 0) >= 19   # the free requests' own cell
        assert ("d=code|t=0|c=json", "dfly") in gw.snapshot.cells
        view = (await c.get("/admin/stats", headers=ADMIN)).json()
        coarse = {(x["level"], x["pool"]): x for x in view["context_cells"]}
        json_cell, free_cell = coarse[("d=code|t=0|c=json", "dfly")], coarse[("d=code|t=0", "dfly")]
        assert (json_cell["domain"], json_cell["temperature"], json_cell["constraint"]) == ("code", "0", "json")
        assert free_cell["constraint"] == "none" and json_cell["acceptance_rate"] < 0.1 < free_cell["acceptance_rate"]
    lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    assert {(x["temperature"], x["constraint"]) for x in lines} == {("0", "none"), ("0", "json")}
