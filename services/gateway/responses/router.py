"""`/v1/responses` over HTTP (and its WebSocket route): request parsing and the HTTP responses;
the work is `ResponsesServing`'s. The serving object needs the state service, so it may come
after the app: until `enable_responses`, every route answers 503 (the socket closes with 1013)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import Response

from services.gateway.edge.answer import add_post, answer, watched
from services.gateway.identity import caller_of
from services.gateway.protocol_common.openai_error import SERVER_ERROR, OpenAIError
from services.gateway.protocol_common.validation import INT64_MAX
from services.gateway.responses.serving import ResponsesServing
from services.gateway.responses.websocket import ResponsesSocket


def enable_responses(app: FastAPI, serving: ResponsesServing | None) -> None:
    app.state.responses = serving


def _serving(request: Request) -> ResponsesServing:
    serving = request.app.state.responses
    if serving is None:
        raise OpenAIError(503, "The Responses API is not available: this gateway has no state service.",
                          type=SERVER_ERROR, headers={"Retry-After": "1"})
    return serving


def _int_param(http: Request, name: str, default: int, low: int | None = None, high: int | None = None) -> int:
    """An integer query parameter within [low, high] (else a 400 naming it: checked before any
    response headers go out, so a stream never starts on a value a lower layer cannot take)."""
    value = http.query_params.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise OpenAIError(400, f"'{name}' must be an integer.", param=name) from None
    if low is not None and number < low:
        raise OpenAIError(400, f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but got "
                          f"{number} instead.", param=name)
    if high is not None and number > high:
        raise OpenAIError(400, f"Invalid '{name}': integer above maximum value. Expected a value <= {high}, but got "
                          f"{number} instead.", param=name)
    return number


def responses_router() -> APIRouter:
    router = APIRouter()

    async def create_response(request: Request) -> Response:
        return await watched(request, _serving(request).create)

    async def compact_response(request: Request) -> Response:
        return await watched(request, _serving(request).compact)

    add_post(router, "/v1/responses", create_response)
    add_post(router, "/v1/responses/compact", compact_response)

    @router.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str) -> Response:
        stream = request.query_params.get("stream") in ("true", "1")
        # sequence numbers start at 0; -1 (none given): from the first event
        after = _int_param(request, "starting_after", -1, low=0, high=INT64_MAX) if stream else -1
        return answer(await _serving(request).retrieve(caller_of(request).identity, response_id, stream=stream,
                                                        after=after))

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        return answer(await _serving(request).delete(caller_of(request).identity, response_id))

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> Response:
        return answer(await _serving(request).cancel(caller_of(request).identity, response_id))

    @router.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(request: Request, response_id: str) -> Response:
        params = request.query_params
        return answer(await _serving(request).input_items(
            caller_of(request).identity, response_id, limit=_int_param(request, "limit", 20),
            order=params.get("order", "desc"), after=params.get("after", "")))

    @router.websocket("/v1/responses")
    async def responses_socket(ws: WebSocket) -> None:
        serving = ws.app.state.responses
        if serving is None:
            await ws.close(code=1013, reason="no state service")
            return
        await ResponsesSocket(serving, ws).serve()

    return router
