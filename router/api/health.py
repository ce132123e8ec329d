"""Liveness, readiness, Prometheus metrics and the dashboard page."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from router.api.common import gateway_of, json_response

router = APIRouter(tags=["ops"])


@router.get("/healthz")
@router.get("/health", include_in_schema=False)  # the name vLLM serves (load tools such as guidellm check it)
async def healthz() -> Response:
    """The process is alive (no dependency is checked)."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Can route: `ready`, or `degraded` (200: serving, but a pool or Redis is down), or `not ready`
    (503: no classifier, no healthy pool, or a policy that routes to no configured pool)."""
    g = gateway_of(request)
    r = g.readiness()
    states = g.pools.states()
    body = {"status": r.status, "reason": r.reason, "reasons": r.reasons, "redis_ok": g.redis_ok,
            "policy_version": g.snapshot.policy.version,
            "pools": {name: {"healthy": st.healthy, "endpoints": st.endpoints} for name, st in states.items()}}
    return json_response(body, status=200 if r.ok else 503, headers=None if r.ok else {"retry-after": "1"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(gateway_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


def content_security_policy(html: str) -> str:
    """The dashboard's CSP: nothing from elsewhere, no framing, and only the page's own scripts (its
    `<script>` blocks and `on...` handlers, allowed by their SHA-256)."""
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    handlers = set(re.findall(r'\son[a-z]+="([^"]*)"', html))
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(x.encode()).digest()).decode()}'"
                      for x in [*scripts, *sorted(handlers)])
    return (f"default-src 'none'; script-src 'unsafe-hashes' {hashes}; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


@functools.cache
def _dashboard() -> tuple[str, str]:
    html = resources.files("router").joinpath("static/dashboard.html").read_text(encoding="utf-8")
    return html, content_security_policy(html)


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    html, csp = _dashboard()
    return HTMLResponse(html, headers={"content-security-policy": csp, "x-frame-options": "DENY",
                                       "x-content-type-options": "nosniff"})
