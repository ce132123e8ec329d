"""One completion request as far as it got (`Exchange`, filled step by step by router/api/completions.py)
and what is done with it once the response is out (`account`): the per-key counts and token charge,
the time series, the access-log line and the trace's end, all built from the `Exchange` once."""

from __future__ import annotations

import time
from dataclasses import dataclass

from router.api.admit import Admitted
from router.api.openai_wire import Api
from router.gateway import Gateway, Turn
from router.keys.ratelimit import ADMITTED
from router.observability.access_log import Outcome
from router.observability.tracing import RequestTrace
from router.routing.decide import Decision


@dataclass(slots=True)
class Served:
    """What the worker gave a request, for the logs and counts."""

    pool: str
    reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    mal: float | None = None


class Exchange:
    """One request as far as it got: filled step by step, read once at the end."""

    __slots__ = ("api", "t0", "trace", "rid", "key", "request", "reservation", "decision", "served", "status",
                 "turn", "conversation", "shadow_pool")

    def __init__(self, api: Api, t0: float, trace: RequestTrace | None) -> None:
        self.api, self.t0, self.trace = api, t0, trace
        self.rid: str | None = None
        self.key = None
        self.request: Admitted | None = None
        self.reservation = ADMITTED  # the key's tokens reserved at admission (none yet)
        self.decision: Decision | None = None
        self.served: Served | None = None
        self.status = 0
        self.turn: Turn | None = None          # the conversation it continues, served before
        self.conversation = b""                # x-specroute-conversation: new, stay or switch ("": none)
        self.shadow_pool: str | None = None    # the shadow policy's pool (not served)


def account(g: Gateway, ex: Exchange) -> None:
    """Per-key counts and token charge, the time series, the access-log line and the trace's end."""
    status = ex.status or 499  # no status: the client went away (or the task was torn down) first
    sv, d, key = ex.served, ex.decision, ex.key
    tokens = sv.prompt_tokens + sv.completion_tokens if sv is not None else 0
    if key is not None:
        g.metrics.key_requests_by(g.metrics.key_label(key.name), str(status)).inc()
        if key.limits.tpm is not None:
            g.keys.limiter.charge(key, tokens, ex.reservation)
    latency = time.perf_counter() - ex.t0
    pool = sv.pool if sv is not None else d.pool if d is not None else None
    domain = d.domain if d is not None else None
    g.series.observe(domain, pool, status, sv.completion_tokens if sv is not None else 0, latency)
    if g.access_log is None and ex.trace is None:
        return
    out = outcome(ex, status)
    if g.access_log is not None:
        g.access_log.write(out, latency)
    if ex.trace is not None:
        ex.trace.end(out, g.snapshot.policy.version)


def outcome(ex: Exchange, status: int) -> Outcome:
    """The access log's (and trace's) view of a finished request."""
    out = Outcome(ex.api)
    out.rid, out.status = ex.rid, status
    if ex.key is not None:
        out.api_key, out.key = ex.key, ex.key.name
    if ex.request is not None:
        out.model, out.stream = ex.request.body.model, ex.request.stream
        out.temperature, out.constraint = ex.request.context.temperature, ex.request.context.constraint
    if ex.decision is not None:
        out.domain, out.pool, out.reason = ex.decision.domain, ex.decision.pool, ex.decision.reason
    if ex.served is not None:
        sv = ex.served
        out.pool, out.reason, out.mal = sv.pool, sv.reason, sv.mal
        out.prompt_tokens, out.completion_tokens = sv.prompt_tokens, sv.completion_tokens
    out.shadow_pool = ex.shadow_pool
    return out
