"""What a browser on another site may not make the gateway do (pure checks, one ASGI gate).

- A body sent to `/v1/*` or `/admin/*` (`POST`, `PUT`, `PATCH`) must be `application/json` (415
  otherwise): a cross-site page can send a "simple" form or text post without asking, but a JSON one
  only after a CORS preflight, which the gateway never grants. This keeps `make run`'s keyless `/v1/*`
  from being spent by any web page, and it is the CSRF protection of `--insecure-admin`.
- A state-changing `/admin/*` request a browser marks as coming from another site (`Sec-Fetch-Site:
  cross-site` or `same-site`), or whose `Origin` names another host than the request's, is refused
  with a 403 whatever its content type.
"""

from __future__ import annotations

from router.http.errors import APIError

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_GUARDED = ("/v1/", "/admin/")


def is_json(content_type: bytes) -> bool:
    """Whether a `Content-Type` value is JSON (`application/json`, parameters allowed)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json"


def check_request(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> APIError | None:
    """The error a request gets before it is handled, or None (pure)."""
    if method not in _CHANGING or not path.startswith(_GUARDED):
        return None
    found = {name: value for name, value in headers if name in (b"content-type", b"origin", b"host",
                                                                   b"sec-fetch-site")}
    if path.startswith("/admin/"):
        site = found.get(b"sec-fetch-site", b"").lower()
        origin = found.get(b"origin")
        host = found.get(b"host", b"")
        foreign_origin = origin is not None and origin.split(b"://", 1)[-1].lower() != host.lower()
        if site in (b"cross-site", b"same-site") or foreign_origin:
            return APIError(403, "cross-site admin requests are refused", code="cross_site_request")
    if method in _BODY_METHODS and not is_json(found.get(b"content-type", b"")):
        return APIError(415, "the request body must be JSON: send `Content-Type: application/json`",
                        code="unsupported_media_type")
    return None
