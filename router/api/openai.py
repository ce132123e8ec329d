"""OpenAI-compatible API routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

The completion routes run the ASGI handler of router/api/completions.py (which the app's fast path
also calls directly, see `FAST_PATHS`); they are declared here so that the OpenAPI document
describes them. Handlers read the raw body, so malformed JSON and oversize bodies become OpenAI
errors, not 422s or 500s.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.api.common import check_api_key, gateway_of, json_response
from router.api.completions import ASGIEndpoint
from router.api.openai_wire import Api
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.http.errors import APIError

__all__ = ["ASGIEndpoint", "FAST_PATHS", "router"]

router = APIRouter(tags=["openai"])

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ERRORS = {
    str(s): {"description": d, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for s, d in [(400, "invalid request"), (401, "bad API key"), (404, "unknown model"),
                 (413, "body too large"), (429, "workers overloaded"), (503, "no healthy worker")]
}

# what the app serves without the framework (router/app.py): POST path -> kind
FAST_PATHS: dict[str, Api] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


def _body_doc(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


@router.post("/v1/chat/completions", openapi_extra=_body_doc(ChatCompletionRequest), responses=_ERRORS)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions (streaming with `stream: true`)."""
    return ASGIEndpoint(gateway_of(request), "chat")


@router.post("/v1/completions", openapi_extra=_body_doc(CompletionRequest), responses=_ERRORS)
async def completions(request: Request) -> Response:
    """OpenAI legacy text completions."""
    return ASGIEndpoint(gateway_of(request), "completion")


def _model_card(model_id: str, created: int, pools: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    """OpenAI's model object plus `specroute.pools`: which pools serve it (engine, speculation), e.g. a vLLM
    pool beside ours. An alias (or the configured model name) is served by every pool."""
    serving = pools.get(model_id) or [p for ps in pools.values() for p in ps]
    return {"id": model_id, "object": "model", "created": created, "owned_by": "specroute",
            "specroute": {"pools": serving}}


@router.get("/v1/models", responses={"401": _ERRORS["401"]})
async def models(request: Request) -> Response:
    g = gateway_of(request)
    check_api_key(request)
    created = int(g.started_at)
    pools = g.pools.pools_of_models()
    return json_response({"object": "list", "data": [_model_card(m, created, pools) for m in g.served_models()]})


@router.get("/v1/models/{model_id:path}", responses={"404": _ERRORS["404"]})
async def model(request: Request, model_id: str) -> Response:
    g = gateway_of(request)
    check_api_key(request)
    if model_id not in g.served_models():
        raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
    return json_response(_model_card(model_id, int(g.started_at), g.pools.pools_of_models()))
