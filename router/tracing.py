"""OpenTelemetry traces of completion requests (off by default).

One trace per request: a server span for the request (the decision as attributes: domain, pool,
reason, policy version, key, status, tokens) with child spans `classify`, `decide` and `upstream`;
the `upstream` span's context goes to the worker as W3C `traceparent` gRPC metadata (the worker logs
it). A client's own `traceparent` header makes the request part of the client's trace.

Cheap when off (`tracing` false, the default): `make_tracer` returns None and the request path only
tests for it. When on, spans are built with explicit timestamps, not as the current span (no
context switches on the hot path); they are exported (`trace_exporter`) not at all (`none`, the
default: the trace context still reaches the workers), in batches to stdout (`console`), or over
OTLP (`otlp`: needs `opentelemetry-exporter-otlp`, not a dependency; endpoint from `otlp_endpoint`
or the usual `OTEL_EXPORTER_OTLP_*` variables).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXPORTERS = ("none", "console", "otlp")
_PROPAGATOR = TraceContextTextMapPropagator()


def make_tracer(enabled: bool, export: str = "none", otlp_endpoint: str | None = None,
                exporter: SpanExporter | None = None) -> Tracer | None:
    """The gateway's tracer (its own provider, not the global one), or None when tracing is off;
    `exporter` (tests) replaces the one `export` names."""
    if not enabled:
        return None
    if exporter is None:
        if export == "console":
            exporter = ConsoleSpanExporter()
        elif export == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError as exc:
                raise RuntimeError("tracing=otlp needs `pip install opentelemetry-exporter-otlp`") from exc
            exporter = OTLPSpanExporter(endpoint=otlp_endpoint) if otlp_endpoint else OTLPSpanExporter()
        elif export != "none":
            raise ValueError(f"trace_exporter must be one of {EXPORTERS}, got {export!r}")
    provider = TracerProvider(resource=Resource.create({"service.name": "specroute-gateway"}))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("specroute.gateway")


def client_context(headers: list[tuple[bytes, bytes]]) -> Context | None:
    """The trace context of a client's `traceparent`/`tracestate` headers, if it sent one."""
    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in (b"traceparent", b"tracestate")}
    return _PROPAGATOR.extract(carrier) if carrier else None


def request_span(tracer: Tracer, name: str, parent: Context | None, start_ns: int) -> trace.Span:
    return tracer.start_span(name, context=parent, kind=SpanKind.SERVER, start_time=start_ns)


def child(tracer: Tracer, parent: trace.Span, name: str, start_ns: int, end_ns: int | None = None,
          kind: SpanKind = SpanKind.INTERNAL, **attrs: Any) -> trace.Span:
    """A child span of `parent` from `start_ns` (ended at `end_ns` when given)."""
    span = tracer.start_span(name, context=trace.set_span_in_context(parent), kind=kind, start_time=start_ns,
                             attributes={k.replace("__", "."): v for k, v in attrs.items() if v is not None})
    if end_ns is not None:
        span.end(end_time=end_ns)
    return span


def grpc_metadata(span: trace.Span) -> tuple[tuple[str, str], ...]:
    """`traceparent` (and `tracestate`) for the worker call made under `span`."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return tuple(carrier.items())


def end_request(out: Any, policy_version: int) -> None:
    """End the request's spans (`out`: router.access_log.Outcome) with the decision as attributes."""
    if out.up_span is not None:
        out.up_span.set_attribute("specroute.status", out.status)
        if out.pool is not None:
            out.up_span.set_attribute("specroute.pool", out.pool)
        out.up_span.end()
    span = out.span
    attrs = {"specroute.request_id": out.rid, "specroute.key": out.key, "specroute.domain": out.domain,
             "specroute.pool": out.pool, "specroute.reason": out.reason, "specroute.policy_version": policy_version,
             "http.response.status_code": out.status, "specroute.prompt_tokens": out.prompt_tokens,
             "specroute.completion_tokens": out.completion_tokens, "specroute.mean_accepted_length": out.mal,
             "specroute.stream": out.stream}
    span.set_attributes({k: v for k, v in attrs.items() if v is not None})
    if out.status >= 500:
        span.set_status(trace.StatusCode.ERROR)
    span.end()
