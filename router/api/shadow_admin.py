"""Admin API of the shadow policy (bearer token, mounted with the admin API): an operator submits a
candidate policy, which then decides beside the live one on live traffic without serving anything
(router/routing/shadow.py), compares the two, and promotes or discards it. Each action is audited
in the policy history (router/state/shadow.py).

- `GET    /admin/shadow`          the candidate, if any, and this gateway's comparison;
- `PUT    /admin/shadow`          submit a candidate (a policy document, as `PUT /admin/policy`);
- `POST   /admin/shadow/promote`  make it the live policy (`{"id", "note"}`; `If-Match` optional, as
                                  a rollback's; 409 unless `id` is the candidate's, when given);
- `DELETE /admin/shadow`          discard it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError

from router.api.admin import _validate, check_servable, parse_if_match, require_admin, wants_force
from router.api.common import gateway_of, json_response, parse_json, read_json
from router.gateway import Gateway
from router.http.asgi import read_body
from router.http.errors import APIError
from router.state.shadow import ShadowDoc, clear_shadow, load_shadow, submit_shadow
from router.state.store import PolicyStore, StoreNotConfigured, StoreUnavailable

router = APIRouter(prefix="/admin/shadow", tags=["admin"])


class ShadowAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(default="", max_length=64, description="the candidate acted on (empty: whichever is there)")
    note: str = Field(default="", max_length=2000)


def _store(g: Gateway) -> PolicyStore:
    if g.store is None:
        raise StoreNotConfigured()
    return g.store


async def _current(g: Gateway, store: PolicyStore, wanted: str) -> ShadowDoc:
    try:
        doc = await load_shadow(store)
    except (RedisError, OSError) as exc:
        g.sync.redis_error(exc)
        raise StoreUnavailable(exc) from exc
    if doc is None:
        raise APIError(404, "there is no shadow policy; submit one with PUT /admin/shadow", code="no_shadow_policy")
    if wanted and wanted != doc.id:
        raise APIError(409, f"the shadow policy is {doc.id!r}, not {wanted!r} (it was replaced meanwhile)",
                       code="shadow_policy_changed", param="id")
    return doc


async def _action(request: Request, g: Gateway) -> ShadowAction:
    raw = await read_body(request.receive, g.settings.max_body_bytes,
                          request.headers.get("content-length", "").encode() or None)
    if not raw.strip():
        return ShadowAction()
    try:
        return ShadowAction.model_validate(parse_json(raw))
    except ValidationError as exc:
        raise APIError(400, f"invalid shadow action: {exc.errors()[0]['msg']}", code="invalid_value") from None


def _view(g: Gateway) -> Response:
    return json_response(g.shadow_view())


@router.get("")
async def get_shadow(request: Request) -> Response:
    require_admin(request)
    return _view(gateway_of(request))


@router.put("")
async def put_shadow(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    store = _store(g)
    candidate = _validate(await read_json(request, g.settings.max_body_bytes))
    live = await g.current_policy()
    try:
        doc = await submit_shadow(store, candidate, actor, live, candidate.comment)
    except (RedisError, OSError) as exc:
        g.sync.redis_error(exc)
        raise StoreUnavailable(exc) from exc
    g.sync.wrote_shadow(doc)
    return _view(g)


@router.post("/promote")
async def promote_shadow(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    store = _store(g)
    body = await _action(request, g)
    doc = await _current(g, store, body.id)
    audit: dict[str, Any] = {"shadow_id": doc.id, "comparison": g.shadow_view().get("comparison")}
    audit.update(check_servable(g, doc.policy, wants_force(request)) or {})
    cur = await g.current_policy()
    if_match = request.headers.get("if-match")
    expected = parse_if_match(if_match, cur.version) if if_match is not None else cur.version
    written = await g.put_policy(doc.policy, expected, actor, action="shadow:promote", note=body.note or doc.note,
                                 audit=audit)
    try:  # a candidate submitted meanwhile stays
        await clear_shadow(store, doc, actor, written, body.note, action="")
        g.sync.wrote_shadow(await load_shadow(store))
    except (RedisError, OSError) as exc:
        g.sync.redis_error(exc)
        raise StoreUnavailable(exc) from exc
    return json_response({"promoted": doc.id, "policy": written.model_dump(mode="json")})


@router.delete("")
async def discard_shadow(request: Request) -> Response:
    actor = require_admin(request)
    g = gateway_of(request)
    store = _store(g)
    body = await _action(request, g)
    doc = await _current(g, store, body.id)
    try:
        cleared = await clear_shadow(store, doc, actor, await g.current_policy(), body.note)
        g.sync.wrote_shadow(await load_shadow(store))
    except (RedisError, OSError) as exc:
        g.sync.redis_error(exc)
        raise StoreUnavailable(exc) from exc
    if not cleared:
        raise APIError(409, f"the shadow policy {doc.id!r} was replaced meanwhile", code="shadow_policy_changed")
    return json_response({"discarded": doc.id})
