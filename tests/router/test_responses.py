"""`/v1/responses` through the real app (fake engine workers, a named test double, on loopback gRPC;
real Redis): the Response object, the streamed events in order, `previous_response_id` (the stored
conversation reaches the worker), `GET /v1/responses/{id}`, unsupported parameters refused by name,
and the store without Redis. Cost: ~3 s."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from router.state.responses import ResponseStore
from tests.router.conftest import engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig
from tests.router.test_openai_api import env

pytestmark = [pytest.mark.timeout(120)]
on_the_session_loop = pytest.mark.asyncio(loop_scope="session")

BASE = {"model": "fake-model", "input": "hi there", "max_output_tokens": 5, "temperature": 0}


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.strip().split("\n\n"):
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        ev = orjson.loads(data[6:])
        assert ev["type"] == kind[7:]
        out.append(ev)
    return out


@on_the_session_loop
async def test_create_stream_follow_up_and_get(redis_url: str) -> None:
    async with env(redis_url) as (client, es):
        r = await client.post("/v1/responses", json={**BASE, "instructions": "be brief"})
        assert r.status_code == 200, r.text
        resp = r.json()
        assert resp["object"] == "response" and resp["id"].startswith("resp_") and resp["status"] == "incomplete"
        assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
        assert resp["output"][0]["content"][0]["text"] == "Hello from the fake engine"
        assert resp["usage"]["output_tokens"] == 5 and resp["specroute"]["pool"] in ("mtp", "dfly")
        sent = [q for e in es for q in e.servicer.requests if q.request_id == r.headers["x-request-id"]][0]
        assert [(m.role, m.content) for m in sent.messages] == [("system", "be brief"), ("user", "hi there")]
        assert (await client.get(f"/v1/responses/{resp['id']}")).json() == resp

        r = await client.post("/v1/responses", json={**BASE, "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "and then?"}]}], "previous_response_id": resp["id"], "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.text)
        kinds = [e["type"] for e in events]
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added"]
        assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                              "response.incomplete"]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == "Hello from the fake engine" == events[-4]["text"]
        follow = events[-1]["response"]
        assert follow["previous_response_id"] == resp["id"] and follow["output"][0]["content"][0]["text"] == text
        sent = [q for e in es for q in e.servicer.requests if q.request_id == r.headers["x-request-id"]][0]
        assert [(m.role, m.content) for m in sent.messages] == [
            ("user", "hi there"), ("assistant", "Hello from the fake engine"), ("user", "and then?")]
        r = await client.post("/v1/responses", json={**BASE, "previous_response_id": follow["id"]})
        sent = [q for e in es for q in e.servicer.requests if q.request_id == r.headers["x-request-id"]][0]
        assert len(sent.messages) == 5

        r = await client.post("/v1/responses", json={**BASE, "store": False})
        assert (await client.get(f"/v1/responses/{r.json()['id']}")).status_code == 404


@on_the_session_loop
async def test_a_stored_response_is_its_keys_alone(redis_url: str) -> None:
    """A stored response is found only with the key that created it (another key's GET and follow-up get
    the 404 of an unknown id), and its id is the gateway's own, never the client's request id (two keys
    sending the same `x-request-id` get two responses, neither overwriting the other)."""
    async with engines(FakeConfig(name="mtp", engine="mtp")) as es, running_app(settings_for(
            {"mtp": [es[0].address]}, redis_url,
            api_keys="team-a:sk-a-0123456789abcdef,team-b:sk-b-0123456789abcdef")) as client:
        a, b = ({"authorization": f"Bearer sk-{t}-0123456789abcdef", "x-request-id": "order-1"} for t in "ab")
        ra = await client.post("/v1/responses", json=BASE, headers=a)
        rb = await client.post("/v1/responses", json=BASE, headers=b)
        assert ra.status_code == rb.status_code == 200 and ra.headers["x-request-id"] == "order-1"
        ida, idb = ra.json()["id"], rb.json()["id"]
        assert ida != idb and "order-1" not in ida + idb and len(ida) > 40
        assert (await client.get(f"/v1/responses/{ida}", headers=a)).json() == ra.json()
        assert (await client.get(f"/v1/responses/{idb}", headers=b)).json() == rb.json()
        other = await client.get(f"/v1/responses/{ida}", headers=b)
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
        follow = await client.post("/v1/responses", json={**BASE, "previous_response_id": ida}, headers=b)
        assert follow.status_code == 404 and follow.json()["error"]["param"] == "previous_response_id"
        assert (await client.post("/v1/responses", json={**BASE, "previous_response_id": ida},
                                  headers=a)).status_code == 200


@on_the_session_loop
async def test_unsupported_and_bad_requests_are_refused_by_name(redis_url: str) -> None:
    async with env(redis_url) as (client, _):
        for name, value in [("tools", [{"type": "function", "name": "f"}]), ("reasoning", {"effort": "low"}),
                            ("text", {"format": {"type": "json_schema", "name": "x", "schema": {}}}),
                            ("include", ["message.output_text.logprobs"]), ("background", True),
                            ("top_logprobs", 2), ("no_such_parameter", 1), ("truncation", "auto")]:
            r = await client.post("/v1/responses", json={**BASE, name: value})
            assert r.status_code == 400 and r.json()["error"]["param"] == name, (name, r.text)
        r = await client.post("/v1/responses", json={**BASE, "input": [{"type": "function_call_output", "call_id": "c"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.type"
        r = await client.post("/v1/responses", json={**BASE, "previous_response_id": "resp_nope"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
        r = await client.post("/v1/responses", json={**BASE, "model": "gpt-9"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = await client.post("/v1/responses", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = await client.post("/v1/responses", json={"model": "fake-model"})
        assert r.status_code == 400
        for bad in ({"text": "x"}, {"text": {"format": "x"}}, {"input": [1]}, {"input": []}, {"input": [{"role": "user"}]},
                    {"input": [{"role": "user", "content": 5}]}, {"input": [{"role": "bot", "content": "x"}]},
                    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                    {"tools": "x"}, {"metadata": {"a": 1}}, {"input": "a\u0000b"}, {"previous_response_id": "x"},
                    {"max_output_tokens": 0}, {"stream": [1]}, {"tool_choice": "required"}):
            r = await client.post("/v1/responses", json={**BASE, **bad})
            assert r.status_code == 400 and set(r.json()["error"]) >= {"message", "param", "code"}, (bad, r.text)


def test_local_store_expires_and_drops_the_oldest() -> None:
    async def go() -> None:
        store = ResponseStore(None, ttl_s=0.05, max_local=2)
        for i in range(3):
            await store.put(f"resp_{i}", {"n": i})
        assert await store.get("resp_0") is None and await store.get("resp_2") == {"n": 2}
        await asyncio.sleep(0.06)
        assert await store.get("resp_2") is None

    asyncio.run(go())
