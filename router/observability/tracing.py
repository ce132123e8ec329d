"""OpenTelemetry traces of completion requests (off by default).

One trace per request: a server span for the request (the decision as attributes: domain, pool,
reason, policy version, key, status, tokens) with child spans `classify`, `decide` and `upstream`;
the `upstream` span's context goes to the worker as W3C `traceparent` gRPC metadata (the worker logs
it). A client's own `traceparent` header makes the request part of the client's trace.

Cheap when off (`tracing` false, the default): `make_tracing` returns None and the request path
only tests for it. When on, spans are built with explicit timestamps, not as the current span (no
context switches on the hot path), each with its attributes given once, at its start or end; spans
the sampler drops are not built at all (`is_recording()`). They are exported (`trace_exporter`) not
at all (`none`, the default), in batches to stdout (`console`), or over OTLP (`otlp`: needs
`opentelemetry-exporter-otlp`, not a dependency; endpoint from `otlp_endpoint` or the usual
`OTEL_EXPORTER_OTLP_*` variables).

With `none` no span would ever leave the process, so none is recorded: the request gets only its
trace context (the SDK's id generator and sampler decide ids and the sampled flag, exactly as for a
recorded span), and that context still reaches the workers.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXPORTERS = ("none", "console", "otlp")
Metadata = tuple[tuple[str, str], ...]
_PROPAGATOR = TraceContextTextMapPropagator()
_RANDOM_TRACE_ID = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))  # W3C level 2 flag (newer SDKs)


class Tracing:
    """The gateway's tracer (its own provider, not the global one) and whether spans are recorded
    (`record`: some exporter takes them)."""

    __slots__ = ("tracer", "provider", "record")

    def __init__(self, provider: TracerProvider, tracer: Tracer, record: bool) -> None:
        self.provider, self.tracer, self.record = provider, tracer, record

    def flush(self) -> None:
        self.provider.force_flush()


def make_tracing(enabled: bool, export: str = "none", otlp_endpoint: str | None = None,
                 exporter: SpanExporter | None = None) -> Tracing | None:
    """The gateway's tracing, or None when it is off (also when `OTEL_SDK_DISABLED` says so);
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
    tracer = provider.get_tracer("specroute.gateway")
    if not isinstance(tracer, Tracer):  # the SDK is disabled: a no-op tracer, nothing to trace or pass on
        provider.shutdown()
        return None
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider, tracer, record=exporter is not None)


def client_context(headers: list[tuple[bytes, bytes]]) -> Context | None:
    """The trace context of a client's `traceparent`/`tracestate` headers, if it sent one."""
    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in (b"traceparent", b"tracestate")}
    return _PROPAGATOR.extract(carrier) if carrier else None


def traceparent(sc: SpanContext) -> Metadata:
    """`traceparent` (and `tracestate`) gRPC metadata naming `sc` as the parent (what the W3C
    propagator injects, without building a context for it)."""
    if not sc.is_valid:
        return ()
    return _metadata(sc.trace_id, sc.span_id, sc.trace_flags, sc.trace_state)


def _metadata(trace_id: int, span_id: int, flags: int, state: TraceState | None) -> Metadata:
    tp = ("traceparent", f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}")
    return (tp, ("tracestate", state.to_header())) if state else (tp,)


def _unrecorded(tracer: Tracer, parent: Context | None, name: str) -> SpanContext:
    """The context of the request's server span without recording it: ids from the tracer's id
    generator, the sampled flag from its sampler (what `Tracer.start_span` would have decided)."""
    ids, sampler = tracer.id_generator, tracer.sampler
    psc = trace.get_current_span(parent).get_span_context()
    if psc.is_valid:
        trace_id, random_id = psc.trace_id, bool(psc.trace_flags & _RANDOM_TRACE_ID)
    else:
        trace_id = ids.generate_trace_id()
        random_id = bool(_RANDOM_TRACE_ID) and bool(getattr(ids, "is_trace_id_random", bool)())
    result = sampler.should_sample(parent, trace_id, name, SpanKind.SERVER)
    flags = (TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT) | (
        _RANDOM_TRACE_ID if random_id else 0)
    return SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=TraceFlags(flags),
                       trace_state=result.trace_state)


class RequestTrace:
    """One request's trace: the server span, its `classify` and `decide` children (`phase`) and the
    `upstream` span (`upstream`, whose context goes to the worker); `end` closes them."""

    __slots__ = ("_tracer", "_ids", "span", "_parent", "_context", "_up")

    def __init__(self, tracing: Tracing, name: str, headers: list[tuple[bytes, bytes]], start_ns: int) -> None:
        t = self._tracer = tracing.tracer
        parent = client_context(headers)
        self._up: trace.Span | None = None
        self._parent: Context | None = None  # the children's parent context, when the span is recorded
        if tracing.record:
            self.span: trace.Span | None = t.start_span(name, context=parent, kind=SpanKind.SERVER,
                                                        start_time=start_ns)
            self._context = self.span.get_span_context()
            if self.span.is_recording():
                self._parent = trace.set_span_in_context(self.span)
        else:
            self.span = None
            self._context = _unrecorded(t, parent, name)
        self._ids = t.id_generator

    @property
    def recording(self) -> bool:
        """Whether spans are built (else `phase` does nothing: the caller may skip its clock reads)."""
        return self._parent is not None

    def phase(self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]) -> None:
        """A finished child span (`classify`, `decide`); None-valued attributes are left out."""
        if self._parent is not None:
            attrs = {k: v for k, v in attributes.items() if v is not None}
            self._tracer.start_span(name, context=self._parent, start_time=start_ns, attributes=attrs).end(end_ns)

    def upstream(self, start_ns: int, pool: str) -> Metadata:
        """Start the `upstream` span; the gRPC metadata that makes it the worker's parent."""
        if self._parent is not None:
            self._up = self._tracer.start_span("upstream", context=self._parent, kind=SpanKind.CLIENT,
                                               start_time=start_ns, attributes={"specroute.pool": pool})
            return traceparent(self._up.get_span_context())
        sc = self._context
        if self.span is not None:  # the sampler dropped it: pass its own context on
            return traceparent(sc)
        if not sc.is_valid:
            return ()
        # a child of the request's context, named without building a SpanContext for it
        return _metadata(sc.trace_id, self._ids.generate_span_id(), sc.trace_flags, sc.trace_state)

    def end(self, out: Any, policy_version: int) -> None:
        """End the spans (`out`: router.observability.access_log.Outcome) with the decision as attributes."""
        up = self._up
        if up is not None:
            if out.pool is not None:
                up.set_attributes({"specroute.status": out.status, "specroute.pool": out.pool})
            else:
                up.set_attribute("specroute.status", out.status)
            up.end()
        span = self.span
        if span is None or self._parent is None:
            return
        attrs = {"specroute.request_id": out.rid, "specroute.key": out.key, "specroute.domain": out.domain,
                 "specroute.temperature": out.temperature, "specroute.constraint": out.constraint,
                 "specroute.pool": out.pool, "specroute.reason": out.reason,
                 "specroute.policy_version": policy_version, "http.response.status_code": out.status,
                 "specroute.prompt_tokens": out.prompt_tokens, "specroute.completion_tokens": out.completion_tokens,
                 "specroute.mean_accepted_length": out.mal, "specroute.stream": out.stream}
        span.set_attributes({k: v for k, v in attrs.items() if v is not None})
        if out.status >= 500:
            span.set_status(trace.StatusCode.ERROR)
        span.end()
