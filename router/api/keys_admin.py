"""Admin API for client keys (bearer admin token, mounted with router/api/admin.py): list keys with
their limits (never a secret), create or change one, delete one, and read the audit log of these
changes. Changes go to Redis (router/keys/store.py), so every gateway applies them within about a
second; this one applies them at once."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from router.api.admin import require_admin
from router.api.common import gateway_of, json_response, read_json
from router.http.errors import APIError
from router.keys.ring import NAME_PATTERN, KeyWrite

router = APIRouter(prefix="/admin", tags=["admin"])
_NAME = re.compile(NAME_PATTERN)


def _name(name: str) -> str:
    if not _NAME.match(name):
        raise APIError(400, f"key name must match {NAME_PATTERN}", param="name", code="invalid_value")
    return name


@router.get("/keys")
async def list_keys(request: Request) -> Response:
    require_admin(request)
    return json_response({"keys": gateway_of(request).keys.listing()})


@router.put("/keys/{name}")
async def put_key(request: Request, name: str) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    try:
        write = KeyWrite.model_validate(await read_json(request, g.settings.max_body_bytes))
    except ValidationError as exc:
        e = exc.errors()[0]
        raise APIError(400, f"invalid key: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}",
                       code="invalid_value") from None
    unknown = [p for p in write.pools if p not in g.pools.names]
    if unknown:
        raise APIError(400, f"unknown pools {unknown} (pools: {g.pools.names})", param="pools", code="invalid_value")
    try:
        return json_response(await g.keys.put(_name(name), write, actor))
    except ValueError as exc:
        raise APIError(400, str(exc), param="secret", code="invalid_value") from None


@router.delete("/keys/{name}")
async def delete_key(request: Request, name: str) -> Response:
    actor = require_admin(request)
    if not await gateway_of(request).keys.delete(_name(name), actor):
        raise APIError(404, f"no stored key {name!r} (keys from the gateway's settings cannot be deleted here)",
                       code="key_not_found")
    return Response(status_code=204)


@router.get("/audit")
async def audit(request: Request, limit: int = 50) -> Response:
    require_admin(request)
    return json_response({"entries": await gateway_of(request).keys.audit(max(1, min(limit, 1000)))})
