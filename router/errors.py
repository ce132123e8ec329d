"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    412: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    428: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error that becomes an OpenAI error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, extra_headers: dict[str, str] | None = None) -> Response:
        headers = {**self.headers, **(extra_headers or {})}
        return Response(orjson.dumps(self.body()), status_code=self.status, media_type="application/json",
                        headers=headers)


_GRPC_STATUS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "context_length_exceeded"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request"),
    grpc.StatusCode.NOT_FOUND: (404, "model_not_found"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "worker_overloaded"),
    grpc.StatusCode.UNAVAILABLE: (503, "worker_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "deadline_exceeded"),
    grpc.StatusCode.CANCELLED: (503, "cancelled"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "unimplemented"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_denied"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "unauthenticated"),
}

# worker failures where another endpoint may succeed (only retried before the first token)
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN,
     grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}
)
# failures that count against an endpoint's circuit breaker (the endpoint is sick, not the request)
ENDPOINT_FAILURES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
     grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)


def from_grpc(code: grpc.StatusCode, details: str | None) -> APIError:
    status, err_code = _GRPC_STATUS.get(code, (502, "worker_error"))
    msg = details or code.name.lower()
    if status == 400 and ("context" in msg.lower() or "too long" in msg.lower()):
        err_code = "context_length_exceeded"
    return APIError(status, f"worker: {msg}", code=err_code)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code,
                        headers=dict(exc.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        return validation_error(exc.errors()).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:  # pragma: no cover - last resort
        return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()


def validation_error(errors: list[Any]) -> APIError:
    """First pydantic error as an OpenAI 400 with `param` set to the offending field path."""
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
    param = ".".join(loc) or None
    msg = str(e.get("msg", "invalid value"))
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")
