"""OpenTelemetry traces (router/tracing.py): one trace per request with classify, decide and upstream
spans and the decision as attributes; the trace context reaches the worker as gRPC metadata; a
client's traceparent is continued; nothing is traced (or sent) when tracing is off."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.cli import build_parser, settings_from_args
from router.tracing import make_tracer
from tests.router.conftest import engines, running_app, settings_for
from tests.router.fake_engine import FakeConfig

pytestmark = pytest.mark.timeout(60)
ASYNC = pytest.mark.asyncio(loop_scope="session")
CODE = {"model": "fake-model", "messages": [{"role": "user", "content": "write python code"}], "max_tokens": 3}
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def _flush(g: Any) -> None:
    g.tracer.span_processor.force_flush()  # the SDK tracer's processor (batched export)


@ASYNC
async def test_one_trace_per_request_propagated_to_the_worker() -> None:
    mem = InMemorySpanExporter()
    async with engines(FakeConfig(), FakeConfig()) as es, running_app(
        settings_for({"mtp": [es[0].address], "dfly": [es[1].address]}, None)
    ) as c:
        g = c.app.state.gateway  # type: ignore[attr-defined]
        assert g.tracer is None  # off by default: no spans, no metadata
        assert (await c.post("/v1/chat/completions", json=CODE)).status_code == 200
        assert "traceparent" not in es[1].servicer.metadata[-1]
        g.tracer = make_tracer(True, exporter=mem)
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


def test_tracing_settings() -> None:
    s = settings_from_args(build_parser().parse_args(["--pool", "a=h:1", "--tracing", "--trace-exporter", "console"]))
    assert s.tracing and s.trace_exporter == "console"
    assert make_tracer(False) is None and make_tracer(True, s.trace_exporter) is not None
    assert make_tracer(True) is not None  # on without an exporter: spans and propagation only
