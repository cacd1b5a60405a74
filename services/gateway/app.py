"""The OpenAI HTTP edge: one router per endpoint over its serving logic (`chat`, `completions`,
`embeddings`, `models`, `responses`), the edge's error handlers and body limit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import FastAPI

from services.common.routes import RouteTable
from services.gateway.chat.router import chat_router
from services.gateway.chat.serving import ChatServing
from services.gateway.completions.router import completions_router
from services.gateway.completions.serving import CompletionServing
from services.gateway.edge.errors import install_handlers
from services.gateway.edge.limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from services.gateway.embeddings.router import embeddings_router
from services.gateway.embeddings.serving import EmbeddingServing
from services.gateway.models.router import models_router
from services.gateway.models.serving import ModelsServing
from services.gateway.readiness import readiness_router
from services.gateway.responses.router import enable_responses, responses_router
from services.gateway.responses.serving import ResponsesServing


@dataclass
class GatewaySettings:
    coordinator: str = "127.0.0.1:50051"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_timeout_s: float | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))


def create_app(table: RouteTable, settings: GatewaySettings, responses: ResponsesServing | None = None) -> FastAPI:
    """The edge app. `responses` (it needs the state service) may be enabled later, on the serving
    loop, with `enable_responses(app, serving)`."""
    app = FastAPI(title="mship", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    enable_responses(app, responses)
    app.include_router(readiness_router(table, settings.coordinator))
    app.include_router(models_router(ModelsServing(table, settings.started_at)))
    app.include_router(chat_router(ChatServing(table, settings.request_timeout_s)))
    app.include_router(completions_router(CompletionServing(table, settings.request_timeout_s)))
    app.include_router(embeddings_router(EmbeddingServing(table, settings.request_timeout_s)))
    app.include_router(responses_router())
    return app
