"""`GET /admin/timeseries`: the dashboard's charts, the same on every gateway (router/observability/timeseries.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.api.admin import require_admin
from router.api.common import gateway_of, json_response
from router.observability.timeseries import aggregate
from router.state.store import StoreNotConfigured, StoreUnavailable

router = APIRouter(prefix="/admin", tags=["admin"])


@router.get("/timeseries")
async def timeseries(request: Request, window: float = 900.0, points: int = 120) -> Response:
    """Samples of the last `window` seconds of every gateway, merged into at most `points` steps."""
    require_admin(request)
    g = gateway_of(request)
    if g.store is None:
        raise StoreNotConfigured()
    window = max(10.0, min(window, g.settings.timeseries_retention_s))
    step = max(g.settings.timeseries_interval_s, window / max(1, min(points, 1000)))
    try:
        samples = await g.series.read(window)
    except Exception as exc:
        g.metrics.redis_errors.inc()
        raise StoreUnavailable(exc) from exc
    return json_response(aggregate(samples, step))
