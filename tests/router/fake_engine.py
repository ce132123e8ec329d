"""`FakeEngineServicer`: an explicitly named TEST DOUBLE of the engine worker (protos/specroute/v1).

It runs on a real loopback grpc.aio server and emits a deterministic word sequence without any
model, with knobs for latency, acceptance per domain (written to Redis like the real worker) and
fault injection. Used by the gateway's unit and integration tests only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from specroute.contracts.feedback import FeedbackRecord, make_recorder
from specroute.redis_url import connect
from specroute.v1 import engine_pb2, engine_pb2_grpc

WORDS = ["Hello", " from", " the", " fake", " engine", ".", " One", " two", " three", " four"]


def fake_text(n: int) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in range(n)]


def fake_logprobs(request: engine_pb2.GenerateRequest, first: int, words: list[str]) -> list[engine_pb2.TokenLogprob]:
    """Made-up logprobs of tokens `first`.. (`words`), when the request asks for them: token i's is
    -(i % 7) / 10, its top tokens are itself and then made-up others."""
    if not request.logprobs:
        return []
    out = []
    for i, w in enumerate(words, first):
        lp = -(i % 7) / 10
        top = [engine_pb2.TokenLogprob(token_id=i, token=w, token_bytes=w.encode(), logprob=lp)]
        top += [engine_pb2.TokenLogprob(token_id=1000 + j, token=f"t{j}", token_bytes=f"t{j}".encode(), logprob=lp - 1 - j)
                for j in range(request.top_logprobs - 1)]
        out.append(engine_pb2.TokenLogprob(token_id=i, token=w, token_bytes=w.encode(), logprob=lp,
                                           top=top[:request.top_logprobs]))
    return out


@dataclass
class FakeConfig:
    name: str = "fake"
    model_id: str = "fake-model"
    engine: str = "fake"
    block_size: int = 4
    max_context: int = 256
    default_max_tokens: int = 8
    token_delay_s: float = 0.0
    acceptance: dict[str, float] = field(default_factory=dict)  # domain -> acceptance rate
    default_acceptance: float = 0.6
    hot_acceptance: float | None = None  # acceptance at temperature > 0.8, when set
    constrained_acceptance: float | None = None  # acceptance of a grammar-constrained output, when set
    step_ms: float = 10.0
    fail: str = ""  # "" | "before_first" | "mid_stream" | "overloaded"
    fail_after: int = 2  # chunks before a mid-stream failure
    redis_url: str | None = None
    coalesce: bool = True  # honour GenerateRequest.coalesce (False: an old worker, one chunk per token)
    chunk_tokens: int = 1  # tokens per streamed chunk after the first (a speculative engine, or a busy worker)
    load_delay_s: float = 0.0  # before answering Load (a busy worker's slow health check)
    unary: bool = True  # answer `Complete` (False: a worker from before it, UNIMPLEMENTED)


class FakeEngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, cfg: FakeConfig) -> None:
        self.cfg = cfg
        self.requests: list[engine_pb2.GenerateRequest] = []
        self.metadata: list[dict[str, str]] = []  # each Generate call's gRPC metadata (trace context)
        self.running = 0
        self.cancelled = 0
        self.completed = 0
        self.unary_calls = 0  # `Complete` calls (answered or not)
        self._redis = connect(cfg.redis_url) if cfg.redis_url else None
        self._record = make_recorder(self._redis) if self._redis is not None else None

    async def Info(self, request: engine_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> engine_pb2.InfoResponse:
        c = self.cfg
        return engine_pb2.InfoResponse(
            model_id=c.model_id, engine=c.engine, drafter=c.engine, block_size=c.block_size,
            max_context=c.max_context, max_running=8, max_waiting=64, dcut=False, version="test",
        )

    async def Load(self, request: engine_pb2.LoadRequest, context: grpc.aio.ServicerContext) -> engine_pb2.LoadResponse:
        if self.cfg.load_delay_s:
            await asyncio.sleep(self.cfg.load_delay_s)
        return engine_pb2.LoadResponse(running=self.running, waiting=0, max_running=8)

    async def Complete(self, request: engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> engine_pb2.GenerateChunk:
        """`Generate`'s chunks merged into its final one, as the real worker answers it."""
        self.unary_calls += 1
        if not self.cfg.unary:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        t0, ttft, texts, n, lps = time.perf_counter(), 0.0, [], 0, []
        final = engine_pb2.GenerateChunk()
        async for ch in self.Generate(request, context):
            ttft = ttft or time.perf_counter() - t0
            texts.append(ch.text)
            n += ch.num_tokens
            lps += ch.logprobs
            final = ch
        final.text, final.num_tokens, final.ttft_ms = "".join(texts), n, ttft * 1000.0
        del final.logprobs[:]
        final.logprobs.extend(lps)
        return final

    async def Generate(self, request: engine_pb2.GenerateRequest, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        c = self.cfg
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata() or ()))
        words = sum(len(m.content.split()) for m in request.messages) + len(request.prompt.split())
        if "TOO_LONG" in request.prompt or any("TOO_LONG" in m.content for m in request.messages) \
                or words > c.max_context:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"prompt is too long for the context of {c.max_context}")
        if c.fail == "before_first":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fake worker is down")
        if c.fail == "overloaded":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "fake worker queue is full")
        n = request.max_tokens or c.default_max_tokens
        alpha = c.acceptance.get(request.domain, c.default_acceptance)
        if c.hot_acceptance is not None and request.sampling.temperature > 0.8:
            alpha = c.hot_acceptance
        if c.constrained_acceptance is not None and request.grammar:
            alpha = c.constrained_acceptance
        self.running += 1
        t0 = time.perf_counter()
        held: list[str] | None = [] if request.coalesce and c.coalesce else None
        try:
            text = ""
            emitted = 0
            finish = "length"
            pending: list[str] = []  # streamed tokens not sent yet (`chunk_tokens`)
            start = len(request.prefix_token_ids)  # a continuation: word i has token id i
            prompt_tokens = words + start
            for i, w in enumerate(fake_text(n)):
                if i < start:
                    text += w
                    continue
                if c.token_delay_s:
                    await asyncio.sleep(c.token_delay_s)
                if c.fail == "mid_stream" and i >= c.fail_after:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "fake worker died mid-stream")
                text += w
                stop_hit = next((s for s in request.stop if s in text), None)
                if stop_hit is not None:
                    finish = "stop"
                    break
                emitted += 1
                if held is not None and i > start:  # coalesce: the first chunk at once, the rest with the final one
                    held.append(w)
                    continue
                pending.append(w)
                if i > start and len(pending) < c.chunk_tokens:
                    continue
                yield engine_pb2.GenerateChunk(text="".join(pending), num_tokens=len(pending),
                                               token_ids=range(i + 1 - len(pending), i + 1),
                                               prompt_tokens=prompt_tokens if i == start else 0,
                                               logprobs=fake_logprobs(request, i + 1 - len(pending), pending))
                pending = []
            steps = max(1, round(emitted / (1 + c.block_size * alpha)))
            drafted = steps * c.block_size
            accepted = round(drafted * alpha)
            rest = held if held is not None else pending
            stats = engine_pb2.SpecStats(
                drafted_tokens=drafted, accepted_tokens=accepted, steps=steps,
                mean_accepted_length=1 + accepted / steps,
            )
            yield engine_pb2.GenerateChunk(
                text="".join(rest), num_tokens=len(rest), token_ids=range(start + emitted - len(rest), start + emitted),
                logprobs=fake_logprobs(request, start + emitted - len(rest), rest), finish_reason=finish, prompt_tokens=prompt_tokens, completion_tokens=emitted, stats=stats
            )
            self.completed += 1
            if self._record is not None:
                await self._record(FeedbackRecord(
                    pool=request.pool, domain=request.domain, tokens=emitted, drafted=drafted, accepted=accepted,
                    steps=steps, wall_ms=steps * c.step_ms + 1.0, ttft_ms=1.0, request_id=request.request_id,
                    engine=c.engine, context=request.context,
                ))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
            _ = t0


class FakeEngine:
    """A loopback grpc.aio server hosting one `FakeEngineServicer` (+ grpc.health.v1)."""

    def __init__(self, cfg: FakeConfig | None = None, port: int = 0) -> None:
        self.cfg = cfg or FakeConfig()
        self.servicer = FakeEngineServicer(self.cfg)
        self.port = port
        self.server: grpc.aio.Server | None = None
        self.health = HealthServicer()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> FakeEngine:
        self.server = grpc.aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(self.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None
        if self.servicer._redis is not None:
            await self.servicer._redis.aclose()
