"""OpenTelemetry traces (router/observability/tracing.py): one trace per request with classify, decide and upstream
spans and the decision as attributes; the trace context reaches the worker as gRPC metadata; a
client's traceparent is continued; nothing is traced (or sent) when tracing is off; without an
exporter nothing is recorded, but the context still reaches the worker."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from router.cli import build_parser, settings_from_args
from router.observability.tracing import RequestTrace, make_tracing, traceparent
from tests.router.conftest import engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(60)
ASYNC = pytest.mark.asyncio(loop_scope="session")
CODE = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 3}
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def _flush(g: Any) -> None:
    g.tracing.flush()  # the provider's batched export


@ASYNC
async def test_one_trace_per_request_propagated_to_the_worker() -> None:
    mem = InMemorySpanExporter()
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, None)
    ) as c:
        g = c.app.state.gateway  # type: ignore[attr-defined]
        assert g.tracing is None  # off by default: no spans, no metadata
        assert (await c.post("/v1/chat/completions", json=CODE)).status_code == 200
        assert "traceparent" not in es[1].servicer.metadata[-1]
        g.tracing = make_tracing(True, exporter=mem)
        r = await c.post("/v1/chat/completions", json={**CODE, "stream": True}, headers={"x-request-id": "t-1"})
        assert r.status_code == 200
        _flush(g)
        spans = {s.name: s for s in mem.get_finished_spans()}
        assert set(spans) == {"POST /v1/chat/completions", "classify", "decide", "upstream"}
        root = spans["POST /v1/chat/completions"]
        tid = root.context.trace_id
        for name in ("classify", "decide", "upstream"):
            assert spans[name].context.trace_id == tid and spans[name].parent.span_id == root.context.span_id
        a = root.attributes
        assert (a["specroute.domain"], a["specroute.pool"], a["specroute.reason"]) == ("code", "dfly", "default")
        assert a["specroute.request_id"] == "t-1" and a["http.response.status_code"] == 200
        assert a["specroute.completion_tokens"] == 3 and a["specroute.stream"] is True
        assert spans["decide"].attributes["specroute.pool"] == "dfly"
        tp = es[1].servicer.metadata[-1]["traceparent"]
        up = spans["upstream"].context
        assert tp.startswith(f"00-{up.trace_id:032x}-{up.span_id:016x}-")  # the worker's parent: upstream

        # a client's trace context is continued
        mem.clear()
        parent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
        await c.post("/v1/chat/completions", json=CODE, headers={"traceparent": parent})
        _flush(g)
        root = next(s for s in mem.get_finished_spans() if s.name.startswith("POST"))
        assert f"{root.context.trace_id:032x}" == CLIENT_TRACE and f"{root.parent.span_id:016x}" == "b7ad6b7169203331"
        sent = [m["traceparent"].split("-")[1] for e in es for m in e.servicer.metadata if "traceparent" in m]
        assert CLIENT_TRACE in sent


def test_sdk_disabled_means_no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert make_tracing(True) is None


def test_tracing_settings() -> None:
    s = settings_from_args(build_parser().parse_args(["--pool", "a=h:1", "--tracing", "--trace-exporter", "console"]))
    assert s.tracing and s.trace_exporter == "console"
    assert make_tracing(False) is None
    assert make_tracing(True, s.trace_exporter).record  # type: ignore[union-attr]
    t = make_tracing(True)
    assert t is not None and not t.record  # on without an exporter: propagation only, nothing recorded


@ASYNC
async def test_without_exporter_the_context_still_reaches_the_worker() -> None:
    async with engines(FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address]}, None, tracing=True)
    ) as c:
        g = c.app.state.gateway  # type: ignore[attr-defined]
        assert g.tracing is not None and not g.tracing.record
        assert (await c.post("/v1/chat/completions", json=CODE)).status_code == 200
        version, tid, sid, flags = es[0].servicer.metadata[-1]["traceparent"].split("-")
        assert version == "00" and len(tid) == 32 and len(sid) == 16 and int(flags, 16) & 1  # sampled
        # a client's trace continues, with its sampling decision and its tracestate
        parent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-00"
        await c.post("/v1/chat/completions", json=CODE, headers={"traceparent": parent, "tracestate": "v=1"})
        md = es[0].servicer.metadata[-1]
        _, tid, sid, flags = md["traceparent"].split("-")
        assert tid == CLIENT_TRACE and sid != "b7ad6b7169203331" and not int(flags, 16) & 1
        assert md["tracestate"] == "v=1"


def test_request_trace_spans_and_sampler() -> None:
    mem = InMemorySpanExporter()
    t = make_tracing(True, exporter=mem)
    assert t is not None
    tr = RequestTrace(t, "POST /v1/completions", [(b"host", b"x")], 1_000)
    tr.phase("classify", 1_000, 2_000, {"specroute.domain": "code", "specroute.uncertainty": 0.1})
    tr.phase("decide", 2_000, 3_000, {"specroute.pool": None, "specroute.reason": "no_healthy_pool"})
    md = dict(tr.upstream(3_000, "mtp"))

    class Out:
        rid, key, domain, pool, reason, status = "r", None, "code", None, "no_healthy_pool", 503
        temperature, constraint = "0", "tools"
        prompt_tokens = completion_tokens = 0
        mal, stream = None, False

    tr.end(Out(), 7)
    t.flush()
    spans = {s.name: s for s in mem.get_finished_spans()}
    assert spans["classify"].start_time == 1_000 and spans["classify"].end_time == 2_000
    assert "specroute.pool" not in spans["decide"].attributes  # None-valued attributes left out
    up = spans["upstream"]
    assert md == dict(traceparent(up.context)) and up.attributes["specroute.status"] == 503
    root = spans["POST /v1/completions"]
    assert root.attributes["specroute.policy_version"] == 7 and not root.status.is_ok
    assert (root.attributes["specroute.temperature"], root.attributes["specroute.constraint"]) == ("0", "tools")
    assert "specroute.key" not in root.attributes

    # spans the sampler drops are not built; the (unsampled) context still goes on
    t.provider.sampler = ALWAYS_OFF  # type: ignore[misc]
    t.tracer.sampler = ALWAYS_OFF
    mem.clear()
    tr = RequestTrace(t, "POST /v1/completions", [], 1_000)
    tr.phase("classify", 1_000, 2_000, {})
    (name, value), = tr.upstream(3_000, "mtp")
    tr.end(Out(), 7)
    t.flush()
    assert mem.get_finished_spans() == () and name == "traceparent" and not int(value[-2:], 16) & 1
