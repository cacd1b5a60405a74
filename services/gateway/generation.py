"""One way to open a generation: the Infer call on a worker replica, with its gRPC failures (before
and after the first token) translated into OpenAI errors in this one place; one way to stop
a generation on every replica of its model; and the one Embed call (`/v1/embeddings`).

Every endpoint (chat, completions, and each Responses path: foreground, WebSocket, background,
compaction) opens its worker call with `open_generation`. Iterate the `Generation` itself (the
worker's events, no extra layer per token); a call that breaks mid-stream raises `UpstreamError`,
which `failure()` turns into the OpenAI error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable

import grpc

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import InferStream, UpstreamError, call_unary, open_infer
from services.common.routes import Endpoint, RouteTable
from services.gateway.edge.upstream import from_grpc
from services.gateway.protocol_common.openai_error import OpenAIError, model_not_found, overloaded

log = logging.getLogger(__name__)
CANCEL_TIMEOUT_S = 5.0
# Cancel failures that say nothing is wrong: the replica is gone (its requests with it).
_QUIET_CANCEL_FAILURES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND}


_USECASE_REFUSALS = {
    common_pb2.USECASE_GENERATE: "The model '{}' is an embedding model: it serves /v1/embeddings only.",
    common_pb2.USECASE_EMBED: "The model '{}' does not support embeddings: it is a text generation model.",
}


def check_routed(table: RouteTable, model: str, usecase: int = common_pb2.USECASE_GENERATE) -> None:
    """Refuse before any work a model this gateway cannot route to (now, or at all), or one that
    serves another usecase than the endpoint's (a 400 naming `model`)."""
    route = table.routes.get(model)
    if route is not None:
        if (route.usecase or common_pb2.USECASE_GENERATE) != usecase:  # unset: a generation model
            raise OpenAIError(400, _USECASE_REFUSALS[usecase].format(model), param="model",
                              code="model_not_supported")
        return
    if model in table.pending or not table.received.is_set():
        raise overloaded(2.0, status=503)  # known but not loaded yet / routes not received yet
    raise model_not_found(model)


class Generation:
    """An open worker call whose first event has arrived. Iterate it for the worker's events;
    `close()` cancels the call (the worker aborts the engine request) and is idempotent."""

    def __init__(self, stream: InferStream, model: str, input_param: str) -> None:
        self.stream, self.model, self.input_param = stream, model, input_param

    def __aiter__(self) -> AsyncIterator[pb.InferEvent]:
        return self.stream.__aiter__()

    def failure(self, e: UpstreamError) -> OpenAIError:
        """The OpenAI error for a call that broke after its first event."""
        return from_grpc(e.details, self.model, input_param=self.input_param)

    def close(self) -> None:
        self.stream.close()


async def open_generation(table: RouteTable, model: str, infer: pb.InferRequest, *, input_param: str,
                          timeout_s: float | None = None) -> Generation:
    """Start the worker call and wait for its first event. `input_param` names the endpoint's
    prompt field (`messages`, `prompt`, `input`) in a context-too-long error. Raises OpenAIError."""
    try:
        stream = await open_infer(table, model, infer, timeout_s)
    except UpstreamError as e:
        raise from_grpc(e.details, model, input_param=input_param) from e
    return Generation(stream, model, input_param)


async def cancel_everywhere(table: RouteTable, model: str, request_ids: Iterable[str],
                            timeout_s: float = CANCEL_TIMEOUT_S) -> None:
    """`Cancel` the requests on every replica of `model`, wherever they run (unknown ids are
    ignored by the worker). Failures are logged, except a replica that is gone."""
    route = table.routes.get(model)
    endpoints = list(route.endpoints) if route else []
    request = pb.CancelRequest(request_ids=list(request_ids))

    async def cancel(endpoint: Endpoint) -> None:  # a coroutine: a closed channel raises when called
        await endpoint.stub.Cancel(request, timeout=timeout_s)

    results = await asyncio.gather(*(cancel(e) for e in endpoints), return_exceptions=True)
    for endpoint, result in zip(endpoints, results, strict=True):
        if isinstance(result, grpc.aio.AioRpcError) and result.code() in _QUIET_CANCEL_FAILURES:
            continue
        if isinstance(result, BaseException):
            log.warning("cancelling %s on %s failed: %r", list(request.request_ids), endpoint.address, result)


async def embed(table: RouteTable, model: str, request: pb.EmbedRequest, *,
                timeout_s: float | None = None) -> pb.EmbedResponse:
    """The Embed call on the best endpoint (retried elsewhere while unanswered). Cancelling the
    caller cancels the call. Raises OpenAIError."""
    try:
        return await call_unary(table, model, lambda endpoint: endpoint.stub.Embed(request, timeout=timeout_s))
    except UpstreamError as e:
        raise from_grpc(e.details, model, input_param="input") from e
