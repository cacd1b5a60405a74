"""The OpenAI HTTP edge: a thin router over the protocol layer and the serving logic."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.routes import RouteTable
from services.gateway import protocol
from services.gateway.errors import OpenAIError, install_handlers, model_not_found
from services.gateway.limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from services.gateway.responses_api import ResponsesAPI
from services.gateway.serving import GenerationCall, serve_generation
from services.gateway.websocket import ResponsesSocket


@dataclass
class GatewaySettings:
    coordinator: str = "127.0.0.1:50051"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_timeout_s: float | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))


def create_app(table: RouteTable, settings: GatewaySettings, responses: ResponsesAPI | None = None) -> FastAPI:
    """The edge app. `responses` (it needs the state service) may be set later, on the serving loop,
    as `app.state.responses`."""
    app = FastAPI(title="mship", docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.state.responses = responses

    def responses_api(request: Request | WebSocket) -> ResponsesAPI:
        api = request.app.state.responses
        if api is None:
            raise OpenAIError(503, "The Responses API is not available: this gateway has no state service.",
                              type="server_error", headers={"Retry-After": "1"})
        return api

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        loaded, pending = sorted(table.routes), sorted(table.pending)
        ready = table.received.is_set() and not pending
        body = {"ready": ready, "loaded": loaded, "pending": pending, "routing_version": table.version,
                "load_times_s": await _load_times(settings.coordinator)}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_card(name, settings) for name in sorted(table.routes)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        if model_id not in table.routes:
            raise model_not_found(model_id)
        return _model_card(model_id, settings)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = protocol.parse_chat_request(await request.body())
        return await serve_generation(request, table, GenerationCall(
            model=req.model, stream=bool(req.stream), request=req,
            assembler=lambda: protocol.ChatCompletionAssembler.for_request(req),
            encoder=lambda: protocol.ChatStreamEncoder.for_request(req)), settings.request_timeout_s)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = protocol.parse_completion_request(await request.body())
        return await serve_generation(request, table, GenerationCall(
            model=req.model, stream=bool(req.stream), request=req, input_param="prompt",
            assembler=lambda: protocol.CompletionAssembler.for_request(req),
            encoder=lambda: protocol.CompletionStreamEncoder.for_request(req)), settings.request_timeout_s)

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        return await responses_api(request).create(request)

    @app.post("/v1/responses/compact")
    async def compact_response(request: Request) -> Response:
        return await responses_api(request).compact(request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str) -> Response:
        return await responses_api(request).retrieve(request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        return await responses_api(request).delete(request, response_id)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> Response:
        return await responses_api(request).cancel(request, response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(request: Request, response_id: str) -> Response:
        return await responses_api(request).input_items(request, response_id)

    @app.websocket("/v1/responses")
    async def responses_socket(ws: WebSocket) -> None:
        api = ws.app.state.responses
        if api is None:
            await ws.close(code=1013, reason="no state service")
            return
        await ResponsesSocket(api, ws).serve()

    return app


def _model_card(name: str, settings: GatewaySettings) -> dict:
    return {"id": name, "object": "model", "created": settings.started_at, "owned_by": "mship"}


async def _load_times(coordinator: str) -> dict[str, float]:
    """Per-model load times from the coordinator (readiness detail; absent if it is unreachable)."""
    try:
        async with grpc.aio.insecure_channel(coordinator) as channel:
            reply = await coordinator_pb2_grpc.CoordinatorStub(channel).ListModels(cpb.ListModelsRequest(), timeout=1)
    except grpc.aio.AioRpcError:
        return {}
    return {m.spec.name: round(m.load_time_s, 2) for m in reply.models}
