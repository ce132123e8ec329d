"""Admin API (bearer token): live policy with ETag/If-Match, validation, history, rollback,
statistics and pools. Mounted only when an admin token is configured or `--insecure-admin` is set.

Policy-store failures are raised as domain errors (router/state/store.py) and become HTTP errors in the
app's exception handlers (router/http/errors.py)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.api.common import gateway_of, json_response, matching_key, read_json
from router.gateway import Gateway
from router.http.errors import APIError, policy_etag
from router.readiness import unservable
from router.routing.policy import Policy, diff_policies, policy_warnings
from router.state.store import StoreNotConfigured, StoreUnavailable, VersionConflict

router = APIRouter(prefix="/admin", tags=["admin"])
log = logging.getLogger("specroute.gateway.admin")


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1)
    note: str = ""


class FailedLogins:
    """Refused admin requests: each one counted (`specroute_admin_auth_failures_total`), and logged
    with the client address, at most `per_window` lines per `window_s` (a flood cannot fill the log;
    the suppressed count is reported with the next line). One per app (`app.state.failed_logins`).

    The brake on guessing: after `free` failures in a row from one client address, that address gets
    a 429 (with `Retry-After`) without its token being checked, for 1 s, then 2, 4, ... up to
    `max_backoff_s` after each further failure; a correct token clears its count. At most
    `max_clients` addresses are remembered (the oldest forgotten first)."""

    def __init__(self, per_window: int = 20, window_s: float = 60.0, free: int = 5,
                 max_backoff_s: float = 300.0, max_clients: int = 10_000) -> None:
        self.per_window, self.window_s = per_window, window_s
        self.window_start = 0.0
        self.logged = self.suppressed = 0
        self.free, self.max_backoff_s, self.max_clients = free, max_backoff_s, max_clients
        self.clients: dict[str, tuple[int, float]] = {}  # address -> (failures in a row, blocked until)

    def check(self, request: Request) -> None:
        """429 while the client's address is backing off."""
        _, until = self.clients.get(_address(request), (0, 0.0))
        wait = until - time.monotonic()
        if wait > 0:
            raise APIError(429, "too many failed admin logins from your address; retry later",
                           code="too_many_failed_logins", headers={"retry-after": str(math.ceil(wait))})

    def succeeded(self, request: Request) -> None:
        self.clients.pop(_address(request), None)

    def record(self, g: Gateway, request: Request, why: str) -> None:
        g.metrics.admin_auth_failures.inc()
        addr = _address(request)
        n = self.clients.pop(addr, (0, 0.0))[0] + 1
        until = time.monotonic() + min(self.max_backoff_s, 2.0 ** (n - self.free)) if n >= self.free else 0.0
        self.clients[addr] = (n, until)
        if len(self.clients) > self.max_clients:
            self.clients.pop(next(iter(self.clients)))
        now = time.monotonic()
        if now - self.window_start > self.window_s:
            self.window_start, self.logged = now, 0
        if self.logged >= self.per_window:
            self.suppressed += 1
            return
        self.logged += 1
        client = request.client.host if request.client else "?"
        more = f" ({self.suppressed} more not logged)" if self.suppressed else ""
        self.suppressed = 0
        log.warning("admin login failed: %s %s from %s: %s%s", request.method, request.url.path, client, why, more)


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def require_admin(request: Request) -> str:
    """The token's name (recorded as the actor of every change)."""
    g = gateway_of(request)
    s = g.settings
    if not s.admin_tokens:
        if s.insecure_admin:
            return "insecure-admin"
        raise APIError(403, "admin API disabled: no admin token configured", code="admin_disabled")
    failed = request.app.state.failed_logins
    failed.check(request)
    header = request.headers.get("authorization", "")
    name = matching_key(header, s.admin_tokens)
    if name is not None:
        failed.succeeded(request)
        return name
    failed.record(g, request, "wrong token" if header else "no token")
    raise APIError(401, "missing or invalid admin token", code="invalid_admin_token",
                   headers={"www-authenticate": "Bearer"})


def wants_force(request: Request) -> bool:
    return request.query_params.get("force", "").lower() in ("1", "true", "yes")


def check_servable(g: Gateway, new: Policy, force: bool) -> dict[str, Any] | None:
    """Refuse (409) a policy that would answer some domain with 503 on this gateway, unless `force`;
    a forced one returns the audit fields that record what was overridden."""
    problems = unservable(new, g.pools.names)
    if not problems:
        return None
    if not force:
        raise APIError(409, f"policy would serve nothing: {'; '.join(problems)}. Fix it, or apply it anyway "
                            "with ?force=true (recorded in the audit log)", code="policy_serves_nothing",
                       param="pools")
    log.warning("forced a policy that serves nothing: %s", "; ".join(problems))
    return {"forced": True, "overridden": problems}


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


def _policy_response(p: Policy) -> Response:
    return json_response(p.model_dump(mode="json"), headers={"etag": policy_etag(p.version)})


def _validate(data: dict[str, Any]) -> Policy:
    try:
        return Policy.model_validate({**data, "version": 0})
    except ValidationError as exc:
        msgs = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'policy'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise APIError(400, f"invalid policy: {msgs}", code="invalid_policy") from None


@router.get("/policy")
async def get_policy(request: Request) -> Response:
    require_admin(request)
    g = gateway_of(request)
    try:
        p = await g.current_policy()
    except StoreUnavailable:  # Redis down: the snapshot is the best we know
        p = g.snapshot.policy
    return _policy_response(p)


@router.put("/policy")
async def put_policy(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    data = await read_json(request, g.settings.max_body_bytes)
    new = _validate(data)
    audit = check_servable(g, new, wants_force(request))
    cur = await g.current_policy()
    expected = parse_if_match(request.headers.get("if-match"), cur.version)
    if expected != cur.version:
        raise VersionConflict(cur.version, expected)
    return _policy_response(await g.put_policy(new, expected, actor, note=new.comment, audit=audit))


@router.post("/policy/validate")
async def validate_policy(request: Request) -> Response:
    require_admin(request)
    g = gateway_of(request)
    data = await read_json(request, g.settings.max_body_bytes)
    try:
        new = _validate(data)
    except APIError as exc:
        return json_response({"valid": False, "errors": [exc.message.removeprefix("invalid policy: ")],
                              "warnings": [], "diff": []})
    cur = g.snapshot.policy
    problems = unservable(new, g.pools.names)
    return json_response({
        "valid": not problems,  # what PUT would accept without ?force=true
        "errors": problems,
        "forceable": bool(problems),
        "warnings": policy_warnings(new, g.pools.names),
        "diff": diff_policies(cur.model_dump(mode="json"), new.model_dump(mode="json")),
        "current_version": cur.version,
    })


@router.get("/policy/versions")
async def policy_versions(request: Request, limit: int = 50) -> Response:
    require_admin(request)
    return json_response({"versions": await gateway_of(request).policy_versions(max(1, min(limit, 500)))})


@router.post("/policy/rollback")
async def rollback_policy(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    try:
        body = RollbackRequest.model_validate(await read_json(request, g.settings.max_body_bytes))
    except ValidationError as exc:
        raise APIError(400, f"invalid rollback request: {exc.errors()[0]['msg']}", code="invalid_value") from None
    if g.store is None:
        raise StoreNotConfigured()
    cur = await g.current_policy()
    if_match = request.headers.get("if-match")
    expected = parse_if_match(if_match, cur.version) if if_match is not None else cur.version
    entry = await g.policy_version(body.version)
    if entry is None:
        raise APIError(404, f"policy version {body.version} is not in the history", code="version_not_found")
    target = _validate(entry["policy"])
    audit = check_servable(g, target, wants_force(request))
    written = await g.put_policy(target, expected, actor, action=f"rollback:{body.version}", note=body.note,
                                 audit=audit)
    return _policy_response(written)


@router.get("/stats")
async def stats(request: Request) -> Response:
    require_admin(request)
    return json_response(gateway_of(request).stats_view())


@router.get("/pools")
async def pools(request: Request) -> Response:
    require_admin(request)
    return json_response(gateway_of(request).pools_view())
