"""End to end, structured output and tools: the official `openai` client -> a real gateway (uvicorn, real
redis-server) -> a real DFly worker process on the demo bundle (models/demo, else the tiny random bundle:
the grammar holds whatever the model). `response_format` json_schema output validates, a forced
(`required` and named) tool call has valid arguments, whole and streamed (classified as code by the
shipped classifier: the tool definitions are evidence of it), a `tool` message round-trips, and a bad
schema is a 400. Costs ~25 s (worker start, ~10 short generations)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
import pytest_asyncio

from classifier import classify
from tests.engines.worker.conftest import Worker
from tests.openai_checks import FUNCS, PERSON, TIME, WEATHER
from tests.redis_server import RedisServer
from tests.router.conftest import settings_for, uvicorn_app

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    bundle = DEMO
    if not (DEMO / "drafters" / "dfly").is_dir():
        from tests.tiny_bundle import make_tiny_bundle

        bundle = make_tiny_bundle(tmp_path_factory.mktemp("b") / "bundle", drafters=("dfly",))
    w = Worker("--engine", "dfly", "--model", str(bundle))
    yield w
    w.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(worker: Worker) -> AsyncIterator[openai.AsyncOpenAI]:
    r = RedisServer().start()
    try:
        # the shipped classifier (not the tests' keyword stand-in): it reads the tools and schemas too
        async with uvicorn_app(settings_for({"dfly": [f"127.0.0.1:{worker.port}"]}, r.url), classify=classify) as (url, _):
            c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
            yield c
            await c.close()
    finally:
        r.stop()


async def test_json_schema_output_validates(client: openai.AsyncOpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    for i, prompt in enumerate(["Describe a person.", "Who are you?"]):
        r = await client.chat.completions.create(model="specroute", messages=[{"role": "user", "content": prompt}],
                                                 response_format=fmt, max_tokens=48, temperature=0.7 * (i % 2))
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), PERSON)
    r = await client.chat.completions.create(model="specroute", messages=ASK, response_format={"type": "json_object"},
                                             max_tokens=16, temperature=0)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


async def test_forced_tool_calls_whole_streamed_and_round_trip(client: openai.AsyncOpenAI) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model="specroute", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=64, temperature=0)
    assert raw.headers["x-specroute-domain"] == "code"   # the tool definitions are evidence of code work
    r = raw.parse()
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    fn = FUNCS[call.function.name]["function"]
    jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])

    stream = await client.chat.completions.create(model="specroute", messages=ASK, tools=[WEATHER, TIME], max_tokens=64,
                                                  tool_choice={"type": "function", "function": {"name": "get_time"}},
                                                  temperature=0, stream=True)
    parts = [c async for c in stream]
    deltas = [tc for c in parts if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert deltas and deltas[0].function.name == "get_time"
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), TIME["function"]["parameters"])
    assert parts[-1].choices[0].finish_reason == "tool_calls"

    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    r2 = await client.chat.completions.create(model="specroute", messages=follow, tools=[WEATHER], max_tokens=16, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls") and r2.usage is not None
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens   # the call and its answer are in the prompt


async def test_bad_schema_is_a_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="specroute", messages=ASK, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}}})
    assert e.value.body["param"].startswith("response_format")   # type: ignore[index]
    with pytest.raises(openai.BadRequestError):   # valid JSON Schema the grammar engine refuses: the worker's 400
        await client.chat.completions.create(model="specroute", messages=ASK, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 3,
                                                                          "maxProperties": 1}}})
