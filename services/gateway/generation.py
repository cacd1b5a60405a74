"""One way to open a generation: the Infer call on a worker replica, with its gRPC failures (before
and after the first token) translated into OpenAI errors in this one place; one way to stop
a generation on every replica of its model; the one Embed call (`/v1/embeddings`); and the audio
calls (`open_audio`: Synthesize, Transcribe).

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
from services.common.infer import InferStream, UpstreamError, call_unary, open_infer, open_stream
from services.common.logs import outgoing_metadata
from services.common.routes import Endpoint, RouteTable
from services.gateway.admission.admission import FREE, Ticket
from services.gateway.edge.metrics import record_generation, waiting
from services.gateway.edge.upstream import from_grpc
from services.gateway.identity import IDENTITY_METADATA
from services.gateway.protocol_common.openai_error import OpenAIError, model_not_found, unavailable

log = logging.getLogger(__name__)
CANCEL_TIMEOUT_S = 5.0
# Cancel failures that say nothing is wrong: the replica is gone (its requests with it).
_QUIET_CANCEL_FAILURES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND}


def call_metadata(identity: str) -> tuple[tuple[str, str | bytes], ...]:
    """A worker call's metadata: the caller's identity (binary metadata: an identity may be any
    text) and the request's id."""
    return (((IDENTITY_METADATA, identity.encode()),) if identity else ()) + outgoing_metadata()


# What a model of each usecase is, and the endpoint that serves it.
_IS = {
    common_pb2.USECASE_GENERATE: ("a text generation model", "/v1/chat/completions, /v1/completions, /v1/responses"),
    common_pb2.USECASE_EMBED: ("an embedding model", "/v1/embeddings"),
    common_pb2.USECASE_SPEECH: ("a text-to-speech model", "/v1/audio/speech"),
    common_pb2.USECASE_TRANSCRIPTION: ("a speech-to-text model", "/v1/audio/transcriptions"),
}
_WANTS = {common_pb2.USECASE_GENERATE: "text generation", common_pb2.USECASE_EMBED: "embeddings",
          common_pb2.USECASE_SPEECH: "speech", common_pb2.USECASE_TRANSCRIPTION: "transcriptions"}


def _usecase_refusal(model: str, served: int, wanted: int) -> str:
    what, where = _IS.get(served, _IS[common_pb2.USECASE_GENERATE])
    if wanted == common_pb2.USECASE_EMBED:
        return f"The model '{model}' does not support embeddings: it is {what}."
    return f"The model '{model}' is {what}: it serves {where} only, not {_WANTS.get(wanted, 'this endpoint')}."


def check_routed(table: RouteTable, model: str, usecase: int = common_pb2.USECASE_GENERATE) -> None:
    """Refuse before any work a model this gateway cannot route to (now, or at all), or one that
    serves another usecase than the endpoint's (a 400 naming `model`)."""
    route = table.routes.get(model)
    if route is not None:
        served = route.usecase or common_pb2.USECASE_GENERATE  # unset: a generation model
        if served != usecase:
            raise OpenAIError(400, _usecase_refusal(model, served, usecase), param="model",
                              code="model_not_supported")
        return
    if model in table.pending or model in table.unhealthy or not table.received.is_set():
        raise unavailable(2.0)  # known but not serving (loading, being replaced) / no routes yet
    raise model_not_found(model)


class Generation:
    """An open worker call whose first event has arrived. Iterate it for the worker's events;
    `close()` cancels the call (the worker aborts the engine request), settles its token
    reservation with what was used, and is idempotent."""

    def __init__(self, stream: InferStream, model: str, input_param: str, ticket: Ticket = FREE) -> None:
        self.stream, self.model, self.input_param, self.ticket = stream, model, input_param, ticket
        self.used_tokens = ticket.prompt_estimate  # until the Final's usage says exactly

    def __aiter__(self) -> AsyncIterator[pb.InferEvent]:
        if not self.ticket.counts_tokens:
            return self.stream.__aiter__()  # no token limit: the worker's events as they come
        return self._counted()

    async def _counted(self) -> AsyncIterator[pb.InferEvent]:
        async for event in self.stream:
            if event.HasField("final"):
                usage = event.final.usage
                self.used_tokens = usage.prompt_tokens + usage.completion_tokens
            else:
                self.used_tokens += event.delta.token_count
            yield event

    def failure(self, e: UpstreamError) -> OpenAIError:
        """The OpenAI error for a call that broke after its first event."""
        return from_grpc(e.details, self.model, input_param=self.input_param)

    def close(self) -> None:
        if not self.stream.closed:
            s = self.stream
            record_generation(self.model, s.first_at, s.last_at, s.events, cut_short=s.cut_short)
        self.stream.close()
        self.ticket.settle(self.used_tokens)


async def open_generation(table: RouteTable, model: str, infer: pb.InferRequest, *, input_param: str,
                          timeout_s: float | None = None, ticket: Ticket = FREE, identity: str = "") -> Generation:
    """Start the worker call and wait for its first event. `input_param` names the endpoint's
    prompt field (`messages`, `prompt`, `input`) in a context-too-long error; `ticket` is the
    request's admission (a call that does not start gives its reservation back). Raises OpenAIError."""
    queue = waiting(model)
    if queue is not None:
        queue.inc()
    try:
        stream = await open_infer(table, model, infer, timeout_s, call_metadata(identity))
    except BaseException as e:
        ticket.settle(0)
        if isinstance(e, UpstreamError):
            raise from_grpc(e.details, model, input_param=input_param) from e
        raise
    finally:
        if queue is not None:
            queue.dec()
    return Generation(stream, model, input_param, ticket)


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
                timeout_s: float | None = None, identity: str = "") -> pb.EmbedResponse:
    """The Embed call on the best endpoint (retried elsewhere while unanswered). Cancelling the
    caller cancels the call. Raises OpenAIError. (Its caller settles the admission: a batch may
    take several calls.)"""
    metadata = call_metadata(identity)
    try:
        return await call_unary(table, model, lambda e: e.stub.Embed(request, timeout=timeout_s, metadata=metadata))
    except UpstreamError as e:
        raise from_grpc(e.details, model, input_param="input") from e


def stream_failure(e: UpstreamError, model: str | None, input_param: str) -> OpenAIError:
    """The OpenAI error of an audio call that broke after its first event."""
    return from_grpc(e.details, model, input_param=input_param)


async def open_audio(table: RouteTable, model: str, method: str, request: pb.SynthesizeRequest | pb.TranscribeRequest,
                     *, input_param: str, timeout_s: float | None = None, identity: str = "") -> InferStream:
    """A Synthesize or Transcribe call (`method`) on the best endpoint, its first event awaited;
    retried elsewhere while nothing was answered, like an Infer call. Iterate the stream for the
    worker's events; `close()` cancels the call (the engine stops before its next sentence or
    segment). Raises OpenAIError."""
    metadata = call_metadata(identity) or None
    try:
        return await open_stream(table, model, lambda e: getattr(e.stub, method)(request, timeout=timeout_s,
                                                                                 metadata=metadata))
    except UpstreamError as e:
        raise from_grpc(e.details, model, input_param=input_param) from e
