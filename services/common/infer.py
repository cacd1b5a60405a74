"""Calls to a worker replica: try the endpoints in the route table's order (the picker's order),
retry another one while nothing has been answered (before an Infer stream's first token, or a
unary call such as Embed), cancel an Infer call to abort the engine request. Shared by the gateway
and the Python client."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

import grpc

from mship.worker.v1 import worker_pb2 as pb
from services.common.affinity import prefix_key
from services.common.delivery import DeliveredCall, ended_here
from services.common.errors import ErrorDetails
from services.common.routes import Endpoint, RouteTable

log = logging.getLogger(__name__)

# Before the first token nothing has been sent to the client, so these are safe to retry elsewhere
# (as is a call gRPC dropped: `ErrorDetails.dropped`).
RETRY_ELSEWHERE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}
START_REFUSED = "start_refused"  # ErrorDetails.metadata: why the coordinator starts no replica of the model


T = TypeVar("T")


class UpstreamError(Exception):
    def __init__(self, details: ErrorDetails) -> None:
        super().__init__(details.message)
        self.details = details


class Attempts:
    """The endpoints one call tries in turn, and why the last one failed. `endpoints()` yields, the
    caller asking for the next only after `failed()` let it:
    1. the route's endpoints, best first (for a model at zero replicas: after its cold start);
    2. once more, each of those whose connection failed (gRPC's own UNAVAILABLE: a GOAWAY, a reset;
       a worker's refusals name their reason) and that is still routed: its channel reconnects at
       once, and a model with one replica would otherwise answer 503 for one broken connection;
    3. when a replica tried had gone (unreachable, or its call dropped), those of a newer snapshot,
       if one arrived meanwhile or arrives within `table.refresh_wait_s`: a gateway's snapshot can
       trail the coordinator's, and a call that found only the replicas a cutover or a rescale just
       stopped is answered by the ones that replaced them.
    An endpoint that left the routes meanwhile (a newer snapshot) is not tried: the call waits
    for, and tries, that snapshot's endpoints instead. Busy replicas are not waited for: the caller
    is told at once."""

    def __init__(self, table: RouteTable, model: str, affinity: str | None = None) -> None:
        self.table, self.model, self.affinity = table, model, affinity
        self.last: ErrorDetails | None = None
        self.gone = False
        self.connection_failed: set[str] = set()  # addresses to try once more

    async def endpoints(self) -> AsyncIterator[Endpoint]:
        """Iterate it inside `aclosing()`: the caller leaves it early on success, and an abandoned
        async generator is closed later by a task of its own (~10 µs a call)."""
        table, version, tried = self.table, self.table.version, set()
        for endpoint in table.candidates(self.model, self.affinity) or await table.cold_start(self.model):
            if endpoint.idle is not None:  # it left the routes while an earlier one was tried
                self.gone = True
                continue
            tried.add(endpoint.address)
            yield endpoint
        again, self.connection_failed = self.connection_failed, set()
        if again:
            for endpoint in table.candidates(self.model, self.affinity):
                if endpoint.address in again:
                    await table.let_go(endpoint)
                    yield endpoint
        if self.gone and await table.wait_newer(version, table.refresh_wait_s):
            for endpoint in table.candidates(self.model, self.affinity):
                if endpoint.address not in tried:
                    yield endpoint

    def closed(self) -> None:
        """The endpoint's channel was just closed by a new snapshot: the replica left the routes."""
        self.gone = True

    def failed(self, endpoint: Endpoint, e: grpc.aio.AioRpcError, started_at: float | None = None) -> None:
        """The attempt on `endpoint` (made at `started_at`, monotonic) failed before anything was
        answered: UpstreamError unless another endpoint may be tried (an unreachable one counts a
        failure on its breaker; a busy one stays in rotation)."""
        self.last = details = ErrorDetails.from_rpc_error(e)
        if details.reason == "MODEL_NOT_FOUND":  # a stale route: another replica has its address now
            self.gone = True
            log.info("%s no longer serves %s; trying again", endpoint.address, self.model)
            return
        if (e.code() not in RETRY_ELSEWHERE and not details.dropped) or (
                e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and details.reason != "OVERLOADED"):
            raise UpstreamError(details) from e  # (gRPC's own: past the message limit, everywhere)
        if e.code() == grpc.StatusCode.UNAVAILABLE or details.dropped:
            self.gone = True
            self.table.mark_bad(endpoint, started_at)
            if e.code() == grpc.StatusCode.UNAVAILABLE and not details.reason:  # the worker names its refusals
                self.connection_failed.add(endpoint.address)
            log.info("%s: %s %s before the first token; trying again", endpoint.address,
                     e.code().name, details.message)

    def refused(self) -> UpstreamError:
        """No endpoint answered: the last failure, or that there was none to try."""
        if self.last is not None:
            return UpstreamError(self.last)
        refused = self.table.start_refused.get(self.model)
        if refused:  # the coordinator is asked again in a while, not before
            return UpstreamError(ErrorDetails(
                grpc.StatusCode.UNAVAILABLE, f"no live replica of {self.model!r}; none will start: {refused}",
                reason="NOT_READY", retry_after_s=self.table.asks_again_in(self.model),
                metadata={START_REFUSED: refused}))
        return UpstreamError(ErrorDetails(grpc.StatusCode.UNAVAILABLE, f"no live replica of {self.model!r}",
                                          reason="NOT_READY", retry_after_s=1.0))


async def within(timeout_s: float | None, work: Awaitable[T]) -> T:
    """`work`, whose attempts, retries and waits (a cold start, a newer snapshot) all fit in the
    call's deadline: DEADLINE_EXCEEDED past it (each attempt's own gRPC deadline is what is left)."""
    if timeout_s is None:
        return await work
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise UpstreamError(ErrorDetails(grpc.StatusCode.DEADLINE_EXCEEDED,
                                         f"no replica answered within the call's deadline ({timeout_s:g} s)")) from None


def left_of(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


async def call_unary(table: RouteTable, model: str, call: Callable[[Endpoint], Awaitable[T]]) -> T:
    """A unary worker call (e.g. `lambda e: e.stub.Embed(request)`) on the best endpoint, counted in
    its outstanding calls while it runs, retried elsewhere like an Infer call before its first token."""
    attempts = Attempts(table, model)
    async with aclosing(attempts.endpoints()) as endpoints:
        async for endpoint in endpoints:
            endpoint.started()
            started_at = time.monotonic()
            try:
                reply = await call(endpoint)
                table.mark_ok(endpoint)
                return reply
            except grpc.aio.UsageError:
                attempts.closed()
            except grpc.aio.AioRpcError as e:
                attempts.failed(endpoint, e, started_at)
            finally:
                endpoint.ended()
    raise attempts.refused()


class InferStream:
    """An Infer call on one endpoint. It counts in `endpoint.outstanding` from the moment it is made
    until `close()`, which takes the count back exactly once and cancels the call (a no-op once it
    has ended; otherwise the engine aborts the request). Iterate it once its first event arrived."""

    def __init__(self, endpoint: Endpoint, call: grpc.aio.UnaryStreamCall | DeliveredCall,
                 table: RouteTable | None = None) -> None:
        self.endpoint, self._call, self._table = endpoint, call, table
        self.started_at = time.monotonic()  # (the breaker: which failures are one)
        self._first: pb.InferEvent | None = None
        self.closed = False
        # What metrics read at the end (monotonic times; a count and a clock read per event, no more).
        self.first_at = self.last_at = 0.0
        self.events = 0
        self.last: pb.InferEvent | None = None  # the latest event read (its Final: the stream is complete)
        self.ended = False  # the worker ended the stream, well or with an error (not cut short here)
        endpoint.started()

    async def _read_first(self) -> bool:
        """Wait for the first event; False when the worker ended the stream without one."""
        try:
            first = await self._call.read()
        except asyncio.CancelledError:
            self._raise_if_dropped()
            raise
        if first is grpc.aio.EOF:
            self.ended = True
            return False
        self._first = self.last = first
        self.first_at = self.last_at = time.monotonic()
        self.events = 1
        return True

    async def __aiter__(self) -> AsyncIterator[pb.InferEvent]:
        assert self._first is not None, "open the stream with open_infer"
        yield self._first
        while True:
            try:
                try:
                    event = await self._call.read()
                except asyncio.CancelledError:
                    self._raise_if_dropped()
                    raise
            except grpc.aio.AioRpcError as e:
                self.ended = True
                details = ErrorDetails.from_rpc_error(e)
                if (e.code() == grpc.StatusCode.UNAVAILABLE or details.dropped) and self._table is not None:
                    self._table.mark_bad(self.endpoint, self.started_at)  # the replica went away mid-stream
                raise UpstreamError(details) from e
            if event is grpc.aio.EOF:
                self.ended = True
                return
            self.events += 1
            self.last_at, self.last = time.monotonic(), event
            yield event

    def _raise_if_dropped(self) -> None:
        """For a read cancelled although neither its caller nor `close()` cancelled it: gRPC ended
        the call here (its channel closed under it), a dropped call. Returns for the caller's own
        cancel, which the caller re-raises."""
        task = asyncio.current_task()
        if not self.closed and not (task is not None and task.cancelling()):
            raise ended_here("its channel closed") from None

    @property
    def cut_short(self) -> bool:
        """Closed here before the worker's Final (and before it ended the stream)."""
        return not self.ended and not (self.last is not None and self.last.HasField("final"))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.endpoint.ended()  # first: a cancel that raises must not keep the count
            self._call.cancel()


async def open_infer(table: RouteTable, model: str, request: pb.InferRequest,
                     timeout_s: float | None = None, metadata: tuple[tuple[str, str | bytes], ...] = ()) -> InferStream:
    """Start the Infer call on the best endpoint (for its prompt's prefix) and wait for its first event.
    `timeout_s`: the call's deadline, retries and the stream after its first event included."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    return await within(timeout_s, open_stream(table, model, lambda e: e.delivery.infer(
        request, timeout=left_of(deadline), metadata=metadata or None), prefix_key(request)))


async def open_stream(table: RouteTable, model: str,
                      start: Callable[[Endpoint], grpc.aio.UnaryStreamCall | DeliveredCall],
                      affinity: str | None = None) -> InferStream:
    """Start a server-streaming worker call (`start(endpoint)`: Infer, Synthesize, Transcribe) on the
    best endpoint and wait for its first event, retrying elsewhere while nothing was answered. Every
    stream that does not come back to the caller is closed here, whatever ends it (an error, a
    cancellation)."""
    attempts = Attempts(table, model, affinity)
    async with aclosing(attempts.endpoints()) as endpoints:
        async for endpoint in endpoints:
            try:
                call = start(endpoint)
            except grpc.aio.UsageError:
                attempts.closed()
                continue
            stream = InferStream(endpoint, call, table)
            try:
                if await stream._read_first():
                    table.mark_ok(endpoint)
                    return stream
            except BaseException as e:
                stream.close()  # cancelled while waiting (client gone): this cancels the engine work too
                if not isinstance(e, grpc.aio.AioRpcError):
                    raise
                attempts.failed(endpoint, e, stream.started_at)
                continue
            stream.close()
            attempts.last = ErrorDetails(grpc.StatusCode.INTERNAL, "the worker ended the stream without an event")
            break
    raise attempts.refused()
