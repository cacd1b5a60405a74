"""Serving shared by chat and completions: one worker call per request, streamed as SSE or
assembled into one JSON object, cancelled when the client disconnects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError
from services.common.routes import RouteTable
from services.gateway.edge.disconnect import ClientDisconnected, unless_disconnected
from services.gateway.edge.errors import CLIENT_CLOSED
from services.gateway.edge.sse import SSE_DONE, EventStreamResponse, sse_event
from services.gateway.generation import Generation, check_routed, open_generation
from services.gateway.identity import cache_salt_for, identity_of
from services.gateway.protocol_common.openai_error import OpenAIError


class Assembler(Protocol):
    id: str

    def add(self, event: pb.InferEvent) -> None: ...
    def result(self) -> dict[str, Any]: ...


class StreamEncoder(Protocol):
    id: str

    def encode(self, event: pb.InferEvent) -> list[dict[str, Any]]: ...


@dataclass
class GenerationCall:
    """What an endpoint hands to `serve_generation`: its request and how to build the response."""

    model: str
    stream: bool
    to_infer: Callable[[str, str | None], pb.InferRequest]  # (request id, cache salt) -> worker request
    assembler: Callable[[], Assembler]
    encoder: Callable[[], StreamEncoder]
    input_param: str = "messages"

    @classmethod
    def of(cls, req: Any, to_infer: Callable[..., pb.InferRequest], assembler: Any, encoder: Any,
           input_param: str = "messages") -> GenerationCall:
        """The call for a parsed `req`, its `to_infer_request`, and its assembler / encoder classes."""
        return cls(req.model, bool(req.stream),
                   lambda request_id, salt: to_infer(req, request_id=request_id, cache_salt=salt),
                   lambda: assembler.for_request(req), lambda: encoder.for_request(req), input_param)


class GenerationServing:
    """An endpoint served by `serve_generation`: subclasses turn the body into its call."""

    def __init__(self, table: RouteTable, timeout_s: float | None = None) -> None:
        self.table, self.timeout_s = table, timeout_s

    def call(self, body: bytes) -> GenerationCall:
        raise NotImplementedError

    async def create(self, http: Request) -> Response:
        return await serve_generation(http, self.table, self.call(await http.body()), self.timeout_s)


async def serve_generation(http: Request, table: RouteTable, call: GenerationCall,
                           timeout_s: float | None = None) -> Response:
    check_routed(table, call.model)
    responder = call.encoder() if call.stream else call.assembler()
    infer = call.to_infer(responder.id, cache_salt_for(identity_of(http)))
    opening = open_generation(table, call.model, infer, input_param=call.input_param, timeout_s=timeout_s)
    try:
        if not call.stream:
            return JSONResponse(await unless_disconnected(http, _assemble(opening, responder)))
        generation = await unless_disconnected(http, opening)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    return EventStreamResponse(_events(generation, responder), release=generation.close)


async def _events(generation: Generation, encoder: StreamEncoder) -> AsyncIterator[bytes]:
    # Starlette closes this generator when the client disconnects; `close()` then cancels the
    # gRPC call and the worker aborts the engine request.
    try:
        async for event in generation:
            for chunk in encoder.encode(event):
                yield sse_event(chunk)
    except UpstreamError as e:  # after the first token: the error travels in the stream
        yield sse_event(generation.failure(e).body())
    except OpenAIError as e:
        yield sse_event(e.body())
    finally:
        generation.close()
    yield SSE_DONE


async def _assemble(opening: Awaitable[Generation], assembler: Assembler) -> dict[str, Any]:
    generation = await opening
    try:
        async for event in generation:
            assembler.add(event)
    except UpstreamError as e:
        raise generation.failure(e) from e
    finally:
        generation.close()
    return assembler.result()
