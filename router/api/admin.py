"""Admin API (bearer token): live policy with ETag/If-Match, validation, history, rollback,
statistics and pools. Mounted only when an admin token is configured or `--insecure-admin` is set."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.api.openai import gateway_of, read_json
from router.errors import APIError
from router.policy import Policy, diff_policies, policy_warnings

router = APIRouter(prefix="/admin", tags=["admin"])


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1)
    note: str = ""


def require_admin(request: Request) -> str:
    """The token's name (recorded as the actor of every change)."""
    s = gateway_of(request).settings
    if not s.admin_tokens:
        if s.insecure_admin:
            return "insecure-admin"
        raise APIError(403, "admin API disabled: no admin token configured", code="admin_disabled")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        for name, secret in s.admin_tokens.items():
            if hmac.compare_digest(token, secret):
                return name
    raise APIError(401, "missing or invalid admin token", code="invalid_admin_token",
                   headers={"www-authenticate": "Bearer"})


def etag(version: int) -> str:
    return f'"{version}"'


def parse_if_match(value: str | None, current: int) -> int:
    if value is None:
        raise APIError(428, "If-Match header required (use the ETag from GET /admin/policy)",
                       code="precondition_required")
    v = value.strip()
    if v == "*":
        return current
    v = v.removeprefix("W/").strip('"').removeprefix("v")
    if not v.isdigit():
        raise APIError(400, f"If-Match {value!r} is not a policy ETag", code="invalid_if_match")
    return int(v)


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json", headers=headers)


def _validate(data: dict[str, Any]) -> Policy:
    try:
        return Policy.model_validate({**data, "version": 0})
    except ValidationError as exc:
        msgs = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'policy'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise APIError(400, f"invalid policy: {msgs}", code="invalid_policy") from None


async def _current(request: Request) -> Policy:
    g = gateway_of(request)
    if g.store is not None:
        try:
            cur = await g.store.get()
            if cur is not None:
                return cur
        except Exception as exc:  # Redis down: the snapshot is the best we know
            g.metrics.redis_errors.inc()
            raise APIError(503, f"policy store unavailable: {exc}", code="store_unavailable") from exc
    return g.snapshot.policy


@router.get("/policy")
async def get_policy(request: Request) -> Response:
    require_admin(request)
    g = gateway_of(request)
    try:
        p = await _current(request)
    except APIError:
        p = g.snapshot.policy
    return _json(p.model_dump(mode="json"), headers={"etag": etag(p.version)})


@router.put("/policy")
async def put_policy(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    data = await read_json(request, g.settings.max_body_bytes)
    new = _validate(data)
    cur = await _current(request)
    expected = parse_if_match(request.headers.get("if-match"), cur.version)
    if expected != cur.version:
        raise APIError(412, f"policy changed meanwhile: current version is {cur.version}, If-Match was {expected}",
                       code="version_conflict", headers={"etag": etag(cur.version)})
    written = await g.put_policy(new, expected, actor, note=new.comment)
    return _json(written.model_dump(mode="json"), headers={"etag": etag(written.version)})


@router.post("/policy/validate")
async def validate_policy(request: Request) -> Response:
    require_admin(request)
    g = gateway_of(request)
    data = await read_json(request, g.settings.max_body_bytes)
    try:
        new = _validate(data)
    except APIError as exc:
        return _json({"valid": False, "errors": [exc.message.removeprefix("invalid policy: ")], "warnings": [],
                      "diff": []})
    cur = g.snapshot.policy
    return _json({
        "valid": True,
        "errors": [],
        "warnings": policy_warnings(new, g.pools.names),
        "diff": diff_policies(cur.model_dump(mode="json"), new.model_dump(mode="json")),
        "current_version": cur.version,
    })


@router.get("/policy/versions")
async def policy_versions(request: Request, limit: int = 50) -> Response:
    require_admin(request)
    g = gateway_of(request)
    if g.store is None:
        return _json({"versions": []})
    try:
        versions = await g.store.versions(max(1, min(limit, 500)))
    except Exception as exc:
        g.metrics.redis_errors.inc()
        raise APIError(503, f"policy store unavailable: {exc}", code="store_unavailable") from exc
    return _json({"versions": versions})


@router.post("/policy/rollback")
async def rollback_policy(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    try:
        body = RollbackRequest.model_validate(await read_json(request, g.settings.max_body_bytes))
    except ValidationError as exc:
        raise APIError(400, f"invalid rollback request: {exc.errors()[0]['msg']}", code="invalid_value") from None
    if g.store is None:
        raise APIError(503, "no policy store configured (set SPECROUTE_REDIS_URL)", code="store_unavailable")
    cur = await _current(request)
    if_match = request.headers.get("if-match")
    expected = parse_if_match(if_match, cur.version) if if_match is not None else cur.version
    try:
        entry = await g.store.version(body.version)
    except Exception as exc:
        g.metrics.redis_errors.inc()
        raise APIError(503, f"policy store unavailable: {exc}", code="store_unavailable") from exc
    if entry is None:
        raise APIError(404, f"policy version {body.version} is not in the history", code="version_not_found")
    target = _validate(entry["policy"])
    written = await g.put_policy(target, expected, actor, action=f"rollback:{body.version}", note=body.note)
    return _json(written.model_dump(mode="json"), headers={"etag": etag(written.version)})


@router.get("/stats")
async def stats(request: Request) -> Response:
    require_admin(request)
    return _json(gateway_of(request).stats_view())


@router.get("/pools")
async def pools(request: Request) -> Response:
    require_admin(request)
    return _json(gateway_of(request).pools_view())
