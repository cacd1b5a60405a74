"""The OpenAI HTTP edge: one router per endpoint over its serving logic (`chat`, `completions`,
`embeddings`, `models`, `responses`, `audio`), and the edge's cross-cutting parts, each in one place:
error handlers, CORS, authentication, the body limit, and admission (rate limits)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from services.common.routes import RouteTable
from services.common.tracing import instrument_app
from services.common.vocabulary import (
    ENV_AUDIT_CONTENT,
    ENV_AUDIT_LOG,
    ENV_CORS_ORIGINS,
    ENV_MAX_AUDIO_BYTES,
    ENV_MAX_REQUEST_BODY_BYTES,
    ENV_NO_METRICS,
    ENV_RATE_LIMITS_FILE,
    forwarded_allow_ips,
    max_connections,
)
from services.gateway.admission.admission import Admission
from services.gateway.admission.buckets import BucketStore, MemoryBuckets
from services.gateway.admission.overrides import RateLimitOverrides
from services.gateway.admission.redis_buckets import RedisBuckets
from services.gateway.audio.protocol_transcription import DEFAULT_MAX_AUDIO_BYTES
from services.gateway.audio.router import audio_router
from services.gateway.audio.serving import SpeechServing, TranscriptionServing
from services.gateway.chat.router import chat_router
from services.gateway.chat.serving import ChatServing
from services.gateway.completions.router import completions_router
from services.gateway.completions.serving import CompletionServing
from services.gateway.edge.audit import AuditMiddleware, AuditSink
from services.gateway.edge.auth import AuthMiddleware
from services.gateway.edge.errors import install_handlers
from services.gateway.edge.http_server import HttpLimits, default_max_connections
from services.gateway.edge.limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from services.gateway.edge.metrics import MetricsMiddleware
from services.gateway.edge.request_id import RequestIdMiddleware
from services.gateway.embeddings.router import embeddings_router
from services.gateway.embeddings.serving import EmbeddingServing
from services.gateway.identity import Authenticator
from services.gateway.models.router import models_router
from services.gateway.models.serving import ModelsServing
from services.gateway.readiness import readiness_router
from services.gateway.responses.router import enable_responses, responses_router
from services.gateway.responses.serving import ResponsesServing


def _env_origins() -> list[str]:
    return [o.strip() for o in os.environ.get(ENV_CORS_ORIGINS, "").split(",") if o.strip()]


def _env_body_limit() -> int:
    value = os.environ.get(ENV_MAX_REQUEST_BODY_BYTES, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_BODY_BYTES


def _env_max_connections() -> int:
    value = max_connections()  # (`mship start` checked it)
    return default_max_connections() if value is None else value


def _env_audio_limit() -> int:
    value = os.environ.get(ENV_MAX_AUDIO_BYTES, "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_AUDIO_BYTES


# what a browser client may read from a response (CORS)
EXPOSED_HEADERS = ["x-request-id", "x-mship-gateway", "retry-after", *(
    f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset") for kind in ("requests", "tokens"))]


@dataclass
class GatewaySettings:
    coordinator: str = "127.0.0.1:50051"
    max_body_bytes: int = field(default_factory=_env_body_limit)
    request_timeout_s: float | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))
    cors_origins: list[str] = field(default_factory=_env_origins)
    rate_store: str = "memory://"  # redis://...: counters shared by every gateway replica
    audit_log: str = field(default_factory=lambda: os.environ.get(ENV_AUDIT_LOG, ""))  # a path, "-", or off
    audit_content: bool = field(default_factory=lambda: os.environ.get(ENV_AUDIT_CONTENT) == "1")
    metrics: bool = field(default_factory=lambda: os.environ.get(ENV_NO_METRICS) != "1")  # `--no-metrics`
    max_audio_bytes: int = field(default_factory=_env_audio_limit)  # /v1/audio/transcriptions' file
    max_connections: int = field(default_factory=_env_max_connections)  # open HTTP connections (0: no cap)
    forwarded_allow_ips: str = field(default_factory=forwarded_allow_ips)  # (`mship start` checked it)

    def http_server_options(self) -> dict[str, Any]:
        """What the replica's HTTP server (`ReusePortServer`) takes from these settings."""
        return {"limits": HttpLimits(max_connections=self.max_connections),
                "forwarded_allow_ips": self.forwarded_allow_ips}


def open_buckets(url: str) -> BucketStore:
    if url.startswith("redis://"):
        return RedisBuckets(url)
    return MemoryBuckets()


def create_app(table: RouteTable, settings: GatewaySettings, responses: ResponsesServing | None = None,
               authenticator: Authenticator | None = None) -> FastAPI:
    """The edge app. `responses` (it needs the state service) may be enabled later, on the serving
    loop, with `enable_responses(app, serving)` (with `app.state.admission`, the app's rate limits)."""
    app = FastAPI(title="mship", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    # Outermost last: the request id -> metrics -> CORS answers preflights (and marks 401s) -> audit ->
    # auth -> the bounded body -> routes.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, authenticator=authenticator or Authenticator.from_env())
    app.state.audit = audit = AuditSink(settings.audit_log) if settings.audit_log else None
    if audit is not None:
        app.add_middleware(AuditMiddleware, sink=audit, content=settings.audit_content)
    if settings.cors_origins:
        wildcard = "*" in settings.cors_origins
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_credentials=not wildcard,
                           allow_methods=["GET", "POST", "DELETE", "OPTIONS"], allow_headers=["*"],
                           expose_headers=EXPOSED_HEADERS, max_age=600)
    if settings.metrics:
        app.add_middleware(MetricsMiddleware)
    app.add_middleware(RequestIdMiddleware)
    instrument_app(app)  # the HTTP span, outermost, when this process traces; nothing otherwise
    admission = Admission(table, open_buckets(settings.rate_store),
                          RateLimitOverrides(os.environ.get(ENV_RATE_LIMITS_FILE) or None),
                          record_usage=audit is not None)
    app.state.admission = admission
    enable_responses(app, responses)
    timeout = settings.request_timeout_s
    app.include_router(readiness_router(table, settings.coordinator))
    app.include_router(models_router(ModelsServing(table, settings.started_at)))
    app.include_router(chat_router(ChatServing(table, timeout, admission)))
    app.include_router(completions_router(CompletionServing(table, timeout, admission)))
    app.include_router(embeddings_router(EmbeddingServing(table, timeout, admission)))
    app.include_router(audio_router(SpeechServing(table, timeout, admission),
                                    TranscriptionServing(table, timeout, admission, settings.max_audio_bytes)))
    app.include_router(responses_router())
    return app
