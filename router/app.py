"""FastAPI app factory: `create_app(settings)` wires the gateway object, routers and error handlers."""

from __future__ import annotations

import gc
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import Receive, Scope, Send

from router.api import admin, health, keys_admin, openai, responses, series, shadow_admin
from router.api.completions import serve
from router.api.responses_wire import ResponsesRequest
from router.api.schemas import ChatCompletionRequest, CompletionRequest
from router.gateway import Gateway
from router.http.asgi import send_response
from router.http.errors import install_handlers
from router.http.origin import check_request
from router.observability.metrics import Metrics
from router.routing.classification import ClassifyFn
from router.settings import Settings

VERSION = "0.1.0"


GC_YOUNG = 20_000   # allocations between young collections (CPython's default: 700)


class GatewayApp(FastAPI):
    """FastAPI with a fast path: `POST /v1/chat/completions` and `POST /v1/completions` go straight
    to their ASGI handler (`router.api.completions.serve`, which produces every response and error of
    these endpoints itself), skipping the framework's middleware and routing. Everything else, and
    these paths under a root path, takes the normal route (which runs the same handler)."""

    gateway: Gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, root = scope["path"], scope.get("root_path", "")
            refused = check_request(scope["method"], path[len(root):] if root and path.startswith(root) else path,
                                    scope["headers"])
            if refused is not None:
                body = orjson.dumps(refused.body())
                await send_response(send, refused.status, [(b"content-type", b"application/json")], body)
                return
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            api = openai.FAST_PATHS.get(scope["path"])
            if api is not None:
                await serve(self.gateway, api, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    *,
    classify: ClassifyFn | None = None,
    rng: random.Random | None = None,
    metrics: Metrics | None = None,
    tune_gc: bool = False,
) -> FastAPI:
    """Build the gateway app. `classify` and `rng` can be injected (tests); by default the classifier
    is imported lazily from `classifier` and the RNG is seeded from `settings.seed`. `tune_gc` (the
    gateway process, not tests): once started, what lives as long as the process (modules, the
    classifier's tables) is frozen out of the cyclic GC, and young collections run less often."""
    settings = settings or Settings()
    gateway = Gateway(settings, classify=classify, rng=rng, metrics=metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        if tune_gc:
            gc.collect()
            gc.freeze()
            gc.set_threshold(GC_YOUNG, 20, 20)
        try:
            yield
        finally:
            await gateway.close()

    app = GatewayApp(
        title="specroute gateway",
        version=VERSION,
        description="OpenAI-compatible gateway that routes each request to the speculative-decoding pool "
        "with the best expected goodput.",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.gateway = gateway
    app.gateway = gateway
    install_handlers(app)
    app.include_router(openai.router)
    app.include_router(responses.router)
    app.include_router(health.router)
    if settings.admin_enabled:
        app.include_router(admin.router)
        app.state.failed_logins = admin.FailedLogins()
        app.include_router(keys_admin.router)
        app.include_router(shadow_admin.router)
        app.include_router(series.router)

    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ChatCompletionRequest, CompletionRequest, ResponsesRequest):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(js.pop("$defs", {}))
            comps[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
    return app
