"""What every API router shares: the gateway of the app (dependency), bearer-token checks, bounded
JSON bodies and JSON responses."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from router.gateway import Gateway
from router.http.asgi import ClientDisconnected, read_body
from router.http.errors import APIError
from router.keys.ring import ApiKey, secret_bytes


def gateway_of(request: Request) -> Gateway:
    """The app's `Gateway` (settings, pools, store, metrics) for a request's handler."""
    return request.app.state.gateway  # type: ignore[no-any-return]


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header value, else None."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def matching_key(header: str, keys: dict[str, str]) -> str | None:
    """The name of the key in `keys` that the `Authorization` header carries (constant-time compare of
    the bytes: any header value, ASCII or not, is a plain mismatch)."""
    token = bearer_token(header)
    if token is None:
        return None
    sent = secret_bytes(token)
    return next((name for name, secret in keys.items() if hmac.compare_digest(sent, secret.encode("utf-8"))), None)


def authenticate(g: Gateway, header: str) -> ApiKey | None:
    """The client's API key (router/keys/ring.py) from its `Authorization` header; None when the gateway
    needs no key; a 401 `APIError` for a missing, wrong or disabled one."""
    ring = g.keys.ring
    if not ring.active:
        return None
    key = ring.lookup(bearer_token(header))
    if key is None:
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    return key


def check_api_key(request: Request) -> ApiKey | None:
    return authenticate(gateway_of(request), request.headers.get("authorization", ""))


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return data


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    try:
        body = await read_body(request.receive, limit, request.headers.get("content-length", "").encode() or None)
    except ClientDisconnected:
        raise ClientDisconnect() from None
    return parse_json(body)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json", headers=headers)
