"""The pure OpenAI wire translation (router/api/openai_wire.py) and the domain-error mapping."""

from __future__ import annotations

from collections import Counter

import grpc
import orjson
import pytest

from router.api import openai_wire as wire
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.http.errors import APIError, from_store, from_upstream
from router.observability.views import routing_shares
from router.routing.decide import Decision
from router.state.store import StoreNotConfigured, StoreUnavailable, VersionConflict
from router.workers.upstream import DeadlineExceeded, NoWorker, WorkerRejected
from specroute.v1 import engine_pb2

D = Decision("mtp", "chat", "default")


def chunk(text: str = "", finish: str = "", **kw: object) -> engine_pb2.GenerateChunk:
    return engine_pb2.GenerateChunk(text=text, finish_reason=finish, **kw)  # type: ignore[arg-type]


def test_generate_request_and_classifier_input() -> None:
    body = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 7, "seed": 3, "stop": "x", "stream": True})
    req = wire.generate_request(body, "rid", D)
    assert [(m.role, m.content) for m in req.messages] == [("system", "be brief"), ("user", "hi")]
    assert (req.request_id, req.domain, req.max_tokens, list(req.stop), req.coalesce) == ("rid", "chat", 7, ["x"], False)
    assert req.sampling.has_seed and req.sampling.seed == 3 and req.sampling.temperature == 1.0
    assert wire.classifier_input(body) == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    comp = CompletionRequest.model_validate({"model": "m", "prompt": ["p"], "temperature": 0})
    req = wire.generate_request(comp, "rid", Decision("dfly", "code", "default"))
    assert req.prompt == "p" and req.coalesce and req.sampling.temperature == 0.0 and not req.sampling.has_seed
    assert wire.classifier_input(comp) == [{"role": "user", "content": "p"}]


def test_collected_spec_object_and_feedback() -> None:
    col = wire.Collected(ttft_s=0.01)
    col.add(chunk("Hel", num_tokens=1, prompt_tokens=4))
    stats = engine_pb2.SpecStats(drafted_tokens=6, accepted_tokens=3, steps=2, steps_by_drafter={"mtp": 1, "plain": 1})
    col.add(chunk("lo", "length", num_tokens=1, completion_tokens=2, stats=stats, cached_prompt_tokens=3))
    assert "".join(col.text) == "Hello" and col.usage() == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
                                                           "prompt_tokens_details": {"cached_tokens": 3}}
    spec = wire.spec_object(D, "dfly", col)
    assert spec == {"domain": "chat", "pool": "dfly", "reason": "fallback", "drafted_tokens": 6,
                    "accepted_tokens": 3, "steps": 2, "mean_accepted_length": 2.5,
                    "steps_by_drafter": {"mtp": 1, "plain": 1}}
    rec = wire.gateway_record(D, "mtp", col, worker_s=0.05)
    assert (rec.tokens, rec.drafted, rec.accepted, rec.steps, rec.engine) == (2, 6, 3, 2, "gateway")
    assert rec.wall_ms == pytest.approx(50.0) and rec.ttft_ms == pytest.approx(10.0)
    assert wire.spec_object(D, "mtp", wire.Collected())["mean_accepted_length"] is None
    assert wire.spec_object(D, "mtp", wire.Collected())["steps_by_drafter"] == {}
    assert wire.finish_reason("") == "stop" and wire.finish_reason("length") == "length"
    with pytest.raises(APIError) as e:
        wire.finish_reason("error")
    assert e.value.status == 502


def test_one_builder_for_json_and_sse() -> None:
    chat = wire.Completion("chat", "r1", 5, 'm"\x00', include_usage=True)
    body = orjson.loads(chat.json("hi", "stop", {"total_tokens": 1}, {"pool": "mtp"}))
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "specroute"]
    assert body["object"] == "chat.completion" and body["id"] == "chatcmpl-r1"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None,
                                "finish_reason": "stop"}]
    # the per-token template is the generic event, byte for byte (even with a NUL in the model name)
    assert chat.token_event('a "quoted" \x00 token') == chat.event(
        [chat.choice('a "quoted" \x00 token', None, stream=True)])
    last = chat.last_events("stop", {"total_tokens": 1}, {"pool": "mtp"}).split(b"\n\n")
    assert [orjson.loads(x[6:]) if x != b"data: [DONE]" else x for x in last[:3]] == [
        {"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 5, "model": 'm"\x00', "usage": None,
         "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]},
        {"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 5, "model": 'm"\x00',
         "usage": {"total_tokens": 1}, "choices": [], "specroute": {"pool": "mtp"}},
        b"data: [DONE]"]
    text = wire.Completion("completion", "r2", 5, "m")
    assert text.token_event("x") == wire.sse({"id": "cmpl-r2", "object": "text_completion", "created": 5, "model": "m",
                                         "choices": [{"index": 0, "text": "x", "logprobs": None,
                                                      "finish_reason": None}]})
    ev = orjson.loads(text.last_events("length", {}, {"pool": "mtp"})[6:].split(b"\n\n")[0])
    assert ev["choices"][0]["text"] == "" and ev["specroute"] == {"pool": "mtp"} and "usage" not in ev


def test_decision_headers() -> None:
    h = dict(wire.decision_headers(D, "mtp", 7, 0.0012345, "abc"))
    assert h == {b"x-specroute-domain": b"chat", b"x-specroute-pool": b"mtp", b"x-specroute-reason": b"default",
                 b"x-specroute-policy-version": b"7", b"x-specroute-overhead-ms": b"1.234", b"x-request-id": b"abc"}
    none = dict(wire.decision_headers(Decision(None, "code", "no_healthy_pool"), None, 1, 0.0, "r"))
    assert none[b"x-specroute-pool"] == b"none" and none[b"x-specroute-reason"] == b"no_healthy_pool"


def test_domain_errors_map_to_openai_errors() -> None:
    cases = [
        (from_upstream(DeadlineExceeded("request deadline exceeded before a worker answered")), 504,
         "deadline_exceeded"),
        (from_upstream(WorkerRejected(grpc.StatusCode.OUT_OF_RANGE, "prompt too long")), 400,
         "context_length_exceeded"),
        (from_upstream(NoWorker(grpc.StatusCode.UNAVAILABLE, "down")), 503, "no_healthy_worker"),
        (from_upstream(NoWorker(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")), 429, "worker_overloaded"),
        (from_upstream(NoWorker()), 503, "no_healthy_pool"),
        (from_store(StoreUnavailable(ConnectionError("refused"))), 503, "store_unavailable"),
        (from_store(StoreNotConfigured()), 503, "store_unavailable"),
        (from_store(VersionConflict(3, 2)), 412, "version_conflict"),
    ]
    assert [(e.status, e.code) for e, _, _ in cases] == [(s, c) for _, s, c in cases]
    assert cases[5][0].message == "policy store unavailable: refused"
    assert cases[7][0].message == "policy changed meanwhile: current version is 3, If-Match was 2"
    assert cases[7][0].headers == {"etag": '"3"'}


def test_routing_shares() -> None:
    decisions = Counter({("code", "dfly", "default"): 3, ("code", "mtp", "explore"): 1, ("chat", "mtp", "pin"): 2})
    assert routing_shares(decisions) == [
        {"domain": "chat", "pool": "mtp", "requests": 2, "share": 1.0},
        {"domain": "code", "pool": "dfly", "requests": 3, "share": 0.75},
        {"domain": "code", "pool": "mtp", "requests": 1, "share": 0.25},
    ]
