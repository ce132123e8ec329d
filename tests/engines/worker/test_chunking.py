"""How `Generate` turns engine events into chunks: a chunk goes out as soon as an event arrives, and
the events already queued behind it (the engine got ahead of the stream) ride in the same chunk; it
never waits for more, so tokens produced slowly still arrive one by one. Over a real loopback
grpc.aio server with a scripted backend (events emitted on the loop, or from a thread like the
batcher's)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence

import grpc
import pytest

from engines.requests import Event, GenRequest, RequestStats, Sink
from engines.worker.backend import BackendInfo
from engines.worker.server import EngineService, chunk_of, ready_events
from engines.worker.settings import WorkerSettings
from specroute.v1 import engine_pb2 as pb
from specroute.v1 import engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)
aio = pytest.mark.asyncio(loop_scope="session")

Script = Callable[[Sink], Awaitable[None]]


def ev(text: str, finish: str = "", n: int = 0) -> Event:
    stats = RequestStats(completion_tokens=n) if finish else None
    return Event([len(text)] if text else [], text, 0.0, finish, stats)


class ScriptedBackend:
    """Runs `script(sink)` as the request (one at a time)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.info = BackendInfo(model_id="scripted", engine="null", drafter="", block_size=0, max_context=1024,
                                max_running=4, max_waiting=4)
        self.cancelled = 0

    def tokenize(self, messages: Sequence[dict] | None, prompt: str) -> list[int]:
        return [1, 2, 3]

    def submit(self, request: GenRequest, sink: Sink) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.script(sink))

    def cancel(self, handle: asyncio.Task[None]) -> None:
        self.cancelled += 1
        handle.cancel()


async def generate(script: Script, *, coalesce: bool = False,
                   on_chunk: Callable[[pb.GenerateChunk], None] | None = None) -> list[pb.GenerateChunk]:
    server = grpc.aio.server()
    pb_grpc.add_EngineServicer_to_server(EngineService(ScriptedBackend(script), WorkerSettings(engine="null")),
                                         server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            req = pb.GenerateRequest(max_tokens=16, coalesce=coalesce)
            req.messages.add(role="user", content="a b c")
            chunks = []
            async for c in pb_grpc.EngineStub(ch).Generate(req, timeout=10):
                chunks.append(c)
                if on_chunk is not None:
                    on_chunk(c)
            return chunks
    finally:
        await server.stop(None)


def test_ready_events_takes_what_is_queued_through_the_last_event() -> None:
    q: asyncio.Queue[Event] = asyncio.Queue()
    assert [e.text for e in ready_events(ev("a"), q)] == ["a"]
    for e in (ev(" b"), ev(" c", "length", 3)):
        q.put_nowait(e)
    assert [e.text for e in ready_events(ev("a"), q)] == ["a", " b", " c"] and q.empty()
    q.put_nowait(ev(" late"))
    assert [e.text for e in ready_events(ev("", "stop"), q)] == [""]  # nothing past a request's last event


def test_chunk_of_joins_text_and_token_ids_in_order() -> None:
    one = chunk_of([ev("a")])
    assert (one.text, list(one.token_ids), one.num_tokens) == ("a", [1], 1)
    many = chunk_of([ev("a"), ev(" bb"), ev(""), ev(" ccc")])
    assert (many.text, list(many.token_ids), many.num_tokens) == ("a bb ccc", [1, 3, 4], 3)


@aio
async def test_queued_events_go_as_one_chunk_and_slow_tokens_one_by_one() -> None:
    gate: asyncio.Queue[None] = asyncio.Queue()

    async def script(sink: Sink) -> None:
        for t in ("a", " b", " c"):  # a burst: queued before the handler reads any of it
            sink(ev(t))
        for t in (" d", " e"):  # then one at a time, each after the client saw the previous chunk
            await gate.get()
            sink(ev(t))
        await gate.get()
        sink(ev(" f", "length", 6))

    chunks = await generate(script, on_chunk=lambda _: gate.put_nowait(None))
    assert [c.text for c in chunks] == ["a b c", " d", " e", " f"]
    assert [c.num_tokens for c in chunks] == [3, 1, 1, 1] and sum(len(c.token_ids) for c in chunks) == 6
    assert chunks[0].prompt_tokens == 3 and [bool(c.finish_reason) for c in chunks] == [False] * 3 + [True]
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 6


@aio
async def test_a_whole_ready_completion_is_one_final_chunk() -> None:
    async def script(sink: Sink) -> None:
        for t in ("a", " b"):
            sink(ev(t))
        sink(ev(" c", "stop", 3))

    for coalesce in (False, True):
        (chunk,) = await generate(script, coalesce=coalesce)
        assert (chunk.text, chunk.num_tokens, chunk.finish_reason) == ("a b c", 3, "stop")
        assert chunk.prompt_tokens == 3 and chunk.completion_tokens == 3


@aio
async def test_events_from_another_thread_keep_their_order() -> None:
    async def script(sink: Sink) -> None:
        def emit() -> None:  # like the batcher's model thread
            for i in range(50):
                sink(ev(f" {i}"))
            sink(ev(" end", "length", 51))

        await asyncio.to_thread(emit)

    chunks = await generate(script)
    assert "".join(c.text for c in chunks) == "".join(f" {i}" for i in range(50)) + " end"
    assert sum(c.num_tokens for c in chunks) == 51 and chunks[-1].finish_reason == "length"
    assert threading.current_thread() is threading.main_thread()


@aio
async def test_deltas_queued_before_an_abort_still_go_out() -> None:
    async def script(sink: Sink) -> None:
        sink(ev("a"))
        sink(ev(" b"))
        sink(Event([], "", 0.0, "error", None, "engine blew up"))

    got: list[pb.GenerateChunk] = []
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await generate(script, on_chunk=got.append)
    assert e.value.code() == grpc.StatusCode.INTERNAL and e.value.details() == "engine blew up"
    assert [c.text for c in got] == ["a b"] and got[0].prompt_tokens == 3
