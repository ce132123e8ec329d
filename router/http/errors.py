"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status.

`APIError` is the HTTP layer's exception; the core's domain errors (`StoreError` from the policy
store, `UpstreamError` from opening a worker stream, gRPC status codes) are mapped to it here and
nowhere else."""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.state.store import StoreError, VersionConflict
from router.workers.upstream import NoWorker, UpstreamError, WorkerRejected

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


# seconds a client should wait before retrying a 429 (overloaded) or 503 (nothing can serve it now):
# long enough for a health check to notice a worker coming back, short enough not to idle clients
RETRY_AFTER_S = 1


class APIError(Exception):
    """An error that becomes an OpenAI error response (a 429 or 503 carries `Retry-After`)."""

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
        self.headers = dict(headers or {})
        if status in (429, 503):
            self.headers.setdefault("retry-after", str(RETRY_AFTER_S))

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

def from_grpc(code: grpc.StatusCode, details: str | None) -> APIError:
    status, err_code = _GRPC_STATUS.get(code, (502, "worker_error"))
    msg = details or code.name.lower()
    if status == 400 and ("context" in msg.lower() or "too long" in msg.lower()):
        err_code = "context_length_exceeded"
    return APIError(status, f"worker: {msg}", code=err_code)


def policy_etag(version: int) -> str:
    """The `ETag` of policy version `version` (what `If-Match` must echo)."""
    return f'"{version}"'


def from_store(exc: StoreError) -> APIError:
    if isinstance(exc, VersionConflict):
        return APIError(412, str(exc), code="version_conflict", headers={"etag": policy_etag(exc.current)})
    return APIError(503, str(exc), code="store_unavailable")


def from_upstream(exc: UpstreamError) -> APIError:
    if isinstance(exc, WorkerRejected):
        return from_grpc(exc.code, exc.details)
    if isinstance(exc, NoWorker):
        if exc.code is None:
            return APIError(503, "no healthy worker for this request", code="no_healthy_pool")
        err = from_grpc(exc.code, exc.details)
        if err.status >= 500:
            err = APIError(503, f"no worker could serve the request: {exc.details}", code="no_healthy_worker")
        return err
    return APIError(504, str(exc), code="deadline_exceeded")


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> Response:
        return from_store(exc).response()

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
