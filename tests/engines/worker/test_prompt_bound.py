"""The worker refuses a prompt that cannot fit its context by its byte size, before tokenizing it
(specroute/contracts/limits.py, the same bound the gateway applies), and tokenizes long prompts in
a thread, off the event loop that streams every other request's tokens. Over a real loopback
grpc.aio server with the `null` backend (its tokenizer counted by a spy)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import grpc
import pytest

from engines.worker.null_engine import NullBackend
from engines.worker.server import TOKENIZE_INLINE_BYTES, EngineService, InvalidRequest, build_request
from engines.worker.settings import WorkerSettings
from specroute.contracts.limits import prompt_byte_limit
from specroute.v1 import engine_pb2 as pb
from specroute.v1 import engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(60)]


def backend_with_spy(context: int) -> tuple[NullBackend, list[bool]]:
    """A null backend whose tokenizer records, per call, whether it ran on the main (event-loop) thread."""
    backend = NullBackend(WorkerSettings(engine="null", context_length=context))
    calls: list[bool] = []
    tokenize = backend.tokenize

    def spy(messages: Sequence[dict] | None, prompt: str) -> list[int]:
        calls.append(threading.current_thread() is threading.main_thread())
        return tokenize(messages, prompt)

    backend.tokenize = spy  # type: ignore[method-assign]
    return backend, calls


async def test_over_long_prompt_is_refused_before_tokenizing() -> None:
    backend, calls = backend_with_spy(256)
    req = pb.GenerateRequest(max_tokens=4)
    req.messages.add(role="user", content="x" * (prompt_byte_limit(256) + 1))
    with pytest.raises(InvalidRequest, match="bytes"):
        build_request(req, backend, 16, None)
    assert calls == []
    req = pb.GenerateRequest(max_tokens=4, prompt="é" * (prompt_byte_limit(256) // 2 + 1))  # 2 bytes each
    with pytest.raises(InvalidRequest, match="context"):
        build_request(req, backend, 16, None)
    assert calls == []
    ok = pb.GenerateRequest(max_tokens=4, prompt="a few words")
    assert build_request(ok, backend, 16, None).prompt_ids and calls == [True]


async def test_long_prompts_are_tokenized_off_the_event_loop() -> None:
    backend, calls = backend_with_spy(4096)
    server = grpc.aio.server()
    pb_grpc.add_EngineServicer_to_server(EngineService(backend, WorkerSettings(engine="null")), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.EngineStub(ch)
            for text in ("short prompt", "word " * (TOKENIZE_INLINE_BYTES // 5 + 10)):
                req = pb.GenerateRequest(max_tokens=3)
                req.messages.add(role="user", content=text)
                chunks = [c async for c in stub.Generate(req, timeout=10)]
                assert chunks[-1].finish_reason == "length"
            big = pb.GenerateRequest(max_tokens=3, prompt="y" * (prompt_byte_limit(4096) + 1))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                _ = [c async for c in stub.Generate(big, timeout=10)]
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes" in (e.value.details() or "")
        assert calls == [True, False]  # the short one inline, the long one in a thread, the huge one never
    finally:
        await server.stop(None)
