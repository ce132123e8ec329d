"""Liveness, readiness, Prometheus metrics and the dashboard page."""

from __future__ import annotations

from importlib import resources

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from router.api.openai import gateway_of

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> Response:
    """The process is alive (no dependency is checked)."""
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Can route: classifier loaded and at least one pool healthy (Redis is not required)."""
    g = gateway_of(request)
    ok, reason = g.ready
    body = {"status": "ready" if ok else "not ready", "reason": reason, "redis_ok": g.redis_ok,
            "policy_version": g.snapshot.policy.version}
    return Response(orjson.dumps(body), status_code=200 if ok else 503, media_type="application/json")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(gateway_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    html = resources.files("router").joinpath("static/dashboard.html").read_text(encoding="utf-8")
    return HTMLResponse(html)
