"""The floor of a gateway on the gateway's own stack: `bench gateway --floor` runs it beside the real one.

The floor answers `POST /v1/chat/completions` with the machinery every request of the real gateway
pays for and nothing else: the same HTTP server (uvicorn on uvloop with the gateway's protocol and
its cork, router/http/guard.py), the same garbage-collector tuning, one parse of the body with
orjson, one worker call over `grpc.aio` (the unary `Complete` when not streaming, the `Generate`
stream otherwise) and an OpenAI-shaped JSON body or SSE events written with orjson. It does no
validation, classification, routing, admission, metrics, feedback or logging, so it is not a
gateway: its CPU time per request is a lower bound on what any gateway built on this stack costs.
With `--classify` it also does the one thing a workload-aware gateway cannot skip: it classifies each
request (`classifier.classify`, the domain goes into the worker request) and computes the routing
features of its text (router/routing/features.py), the two inputs every routing decision reads.

Run it as `python -m bench.gateway_floor --port P --worker HOST:PORT [--classify]`.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

import grpc
import orjson
from starlette.types import Receive, Scope, Send

from classifier import classify
from router.api.openai_wire import SSE_DONE, SSE_HEADERS
from router.app import GC_YOUNG
from router.http.asgi import JSON_CONTENT_TYPE, cork_of
from router.routing.features import prompt_features
from router.settings import Settings
from specroute.v1 import engine_pb2, engine_pb2_grpc


def _request(body: dict[str, Any], domain: str) -> engine_pb2.GenerateRequest:
    stream = bool(body.get("stream"))
    req = engine_pb2.GenerateRequest(max_tokens=int(body.get("max_tokens") or 16), domain=domain, pool="null",
                                     coalesce=not stream, temperature_bucket="0")
    for m in body["messages"]:
        req.messages.add(role=m["role"], content=m["content"])
    return req


def _classified(body: dict[str, Any]) -> str:
    """The request's domain by the shipped classifier, its routing features computed beside it."""
    messages = body["messages"]
    prompt_features([m["content"] for m in messages], body.get("temperature"))
    return classify(messages).label


def _chunk(rid: str, created: int, delta: dict[str, str], finish: str | None) -> bytes:
    return b"data: " + orjson.dumps({"id": rid, "object": "chat.completion.chunk", "created": created,
                                     "model": "null", "choices": [{"index": 0, "delta": delta,
                                                                   "finish_reason": finish}]}) + b"\n\n"


class Floor:
    """The ASGI app (lifespan and HTTP)."""

    def __init__(self, worker: str, classify: bool = False) -> None:
        self.worker, self.classify = worker, classify
        self.stub: Any = None
        self.n = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._answer(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self.stub = engine_pb2_grpc.EngineStub(grpc.aio.insecure_channel(self.worker))
                if self.classify:
                    _classified({"messages": [{"role": "user", "content": "warm up"}]})   # load the artifact
                gc.collect()
                gc.freeze()
                gc.set_threshold(GC_YOUNG, 20, 20)
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        msg = await receive()
        body = orjson.loads(msg.get("body", b""))
        req = _request(body, _classified(body) if self.classify else "chat")
        self.n += 1
        rid, created, cork = f"chatcmpl-floor{self.n}", int(time.time()), cork_of(scope)
        if not body.get("stream"):
            r = await self.stub.Complete(req, timeout=30)
            out = orjson.dumps({"id": rid, "object": "chat.completion", "created": created, "model": "null",
                                "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text},
                                             "finish_reason": r.finish_reason}],
                                "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                                          "total_tokens": r.prompt_tokens + r.completion_tokens}})
            if cork is not None:
                cork.cork()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [JSON_CONTENT_TYPE, (b"content-length", b"%d" % len(out))]})
            await send({"type": "http.response.body", "body": out})
            if cork is not None:
                cork.uncork()
            return
        if cork is not None:  # the head, the role event and the first token: one write, as the gateway does
            cork.cork()
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": _chunk(rid, created, {"role": "assistant"}, None),
                    "more_body": True})
        async for ch in self.stub.Generate(req, timeout=30):
            if ch.text:
                await send({"type": "http.response.body", "body": _chunk(rid, created, {"content": ch.text}, None),
                            "more_body": True})
            if ch.finish_reason:
                if cork is not None:
                    cork.cork()
                await send({"type": "http.response.body", "more_body": False,
                            "body": _chunk(rid, created, {}, ch.finish_reason) + SSE_DONE})
            elif cork is not None:
                cork.uncork()
        if cork is not None:
            cork.uncork()


def main(argv: list[str]) -> int:
    import uvicorn

    from router.http.guard import uvicorn_options

    ap = argparse.ArgumentParser(prog="python -m bench.gateway_floor", description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--worker", required=True, help="the worker's HOST:PORT")
    ap.add_argument("--classify", action="store_true", help="classify each request and compute its routing features")
    args = ap.parse_args(argv)
    uvicorn.run(Floor(args.worker, args.classify), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                loop="uvloop", **uvicorn_options(Settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
