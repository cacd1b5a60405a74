"""One Infer call to a worker replica: pick the least loaded endpoint, retry another one before
the first token, cancel the call to abort the engine request. Shared by the gateway and the
Python client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import ErrorDetails
from services.common.routes import Endpoint, RouteTable

# Before the first token nothing has been sent to the client, so these are safe to retry elsewhere.
RETRY_ELSEWHERE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}


class UpstreamError(Exception):
    def __init__(self, details: ErrorDetails) -> None:
        super().__init__(details.message)
        self.details = details


class InferStream:
    """An open Infer call whose first event has arrived. Iterate it; `close()` cancels it."""

    def __init__(self, endpoint: Endpoint, call: grpc.aio.UnaryStreamCall, first: pb.InferEvent) -> None:
        self.endpoint, self._call, self._first = endpoint, call, first
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[pb.InferEvent]:
        yield self._first
        while True:
            try:
                event = await self._call.read()
            except grpc.aio.AioRpcError as e:
                raise UpstreamError(ErrorDetails.from_rpc_error(e)) from e
            if event is grpc.aio.EOF:
                return
            yield event

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call.cancel()  # a no-op once the call has ended; otherwise the engine aborts
            self.endpoint.outstanding -= 1


async def open_infer(table: RouteTable, model: str, request: pb.InferRequest,
                     timeout_s: float | None = None) -> InferStream:
    """Start the call on the least loaded endpoint and wait for its first event."""
    last: ErrorDetails | None = None
    for endpoint in table.candidates(model):
        endpoint.outstanding += 1
        try:
            call = endpoint.stub.Infer(request, timeout=timeout_s)
        except grpc.aio.UsageError:  # its channel was just closed by a new snapshot: try another
            endpoint.outstanding -= 1
            continue
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as e:
            endpoint.outstanding -= 1
            last = ErrorDetails.from_rpc_error(e)
            if e.code() in RETRY_ELSEWHERE:
                if e.code() == grpc.StatusCode.UNAVAILABLE:  # unreachable; a busy replica stays in rotation
                    table.mark_bad(endpoint)
                continue
            raise UpstreamError(last) from e
        except BaseException:  # cancelled while waiting (client gone): cancel the engine work too
            endpoint.outstanding -= 1
            call.cancel()
            raise
        if first is grpc.aio.EOF:
            endpoint.outstanding -= 1
            last = ErrorDetails(grpc.StatusCode.INTERNAL, "the worker ended the stream without an event")
            break
        return InferStream(endpoint, call, first)
    raise UpstreamError(last or ErrorDetails(grpc.StatusCode.UNAVAILABLE, f"no live replica of {model!r}",
                                             reason="NOT_READY", retry_after_s=1.0))
