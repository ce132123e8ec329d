"""What every API router shares: the gateway of the app (dependency), bearer-token checks, bounded
JSON bodies and JSON responses."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from router.asgi import ClientDisconnected, read_body
from router.errors import APIError
from router.gateway import Gateway


def gateway_of(request: Request) -> Gateway:
    """The app's `Gateway` (settings, pools, store, metrics) for a request's handler."""
    return request.app.state.gateway  # type: ignore[no-any-return]


def bearer_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header value, else None."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def matching_key(header: str, keys: dict[str, str]) -> str | None:
    """The name of the key in `keys` that the `Authorization` header carries (constant-time compare)."""
    token = bearer_token(header)
    if token is None:
        return None
    return next((name for name, secret in keys.items() if hmac.compare_digest(token, secret)), None)


def check_authorization(header: str, keys: dict[str, str]) -> str | None:
    """`header` (the Authorization value) must carry one of `keys` as a bearer token (if any are set);
    returns the key's name (None when no keys are set)."""
    if not keys:
        return None
    name = matching_key(header, keys)
    if name is None:
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    return name


def check_api_key(request: Request, keys: dict[str, str]) -> None:
    check_authorization(request.headers.get("authorization", ""), keys)


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
