"""Serving logic shared by the generation endpoints: one worker call per request, streamed as
SSE or assembled into one JSON object, cancelled when the client disconnects."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError, open_infer
from services.common.routes import RouteTable
from services.gateway.disconnect import ClientDisconnected, unless_disconnected
from services.gateway.errors import OpenAIError, from_grpc, model_not_found, overloaded
from services.gateway.identity import cache_salt_for, identity_of
from services.gateway.protocol import SSE_DONE, sse_event, to_infer_request

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's code: nobody reads it, but logs and metrics do


class Assembler(Protocol):
    id: str

    def add(self, event: pb.InferEvent) -> None: ...
    def result(self) -> dict[str, Any]: ...


class StreamEncoder(Protocol):
    id: str

    def encode(self, event: pb.InferEvent) -> list[dict[str, Any]]: ...


@dataclass
class GenerationCall:
    """What an endpoint hands to `serve_generation`: the parsed request and its response builders."""

    model: str
    stream: bool
    request: Any  # the endpoint's wire model
    assembler: Callable[[], Assembler]
    encoder: Callable[[], StreamEncoder]
    input_param: str = "messages"


def check_routed(table: RouteTable, model: str) -> None:
    if model in table.routes:
        return
    if model in table.pending or not table.received.is_set():
        raise overloaded(2.0, status=503)  # known but not loaded yet / routes not received yet
    raise model_not_found(model)


async def serve_generation(http: Request, table: RouteTable, call: GenerationCall,
                           timeout_s: float | None = None) -> Response:
    check_routed(table, call.model)
    identity = identity_of(http)
    responder = call.encoder() if call.stream else call.assembler()
    infer = to_infer_request(call.request, request_id=responder.id, cache_salt=cache_salt_for(identity))

    def http_error(e: UpstreamError) -> OpenAIError:
        return from_grpc(e.details, call.model, input_param=call.input_param)

    try:
        if not call.stream:
            return JSONResponse(await unless_disconnected(http, _assemble(table, call.model, infer, responder,
                                                                          timeout_s)))
        stream = await unless_disconnected(http, open_infer(table, call.model, infer, timeout_s))
    except UpstreamError as e:
        raise http_error(e) from e
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)

    async def events() -> AsyncIterator[bytes]:
        # Starlette cancels this generator when the client disconnects; `close()` then cancels the
        # gRPC call and the worker aborts the engine request.
        try:
            async for event in stream:
                for chunk in responder.encode(event):
                    yield sse_event(chunk)
        except UpstreamError as e:  # after the first token: the error travels in the stream
            yield sse_event(http_error(e).body())
        except OpenAIError as e:
            yield sse_event(e.body())
        finally:
            stream.close()
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _assemble(table: RouteTable, model: str, infer: pb.InferRequest, assembler: Assembler,
                    timeout_s: float | None) -> dict[str, Any]:
    stream = await open_infer(table, model, infer, timeout_s)
    try:
        async for event in stream:
            assembler.add(event)
    finally:
        stream.close()
    return assembler.result()
