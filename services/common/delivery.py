"""The caller's end of a worker's delivery streams: one `Deliver` stream per endpoint carries the
deltas of every Infer call made on it, whatever the worker had ready in one message, instead of one
gRPC message per token on each call (services/worker/delivery.py is the worker's end).

Each Infer call stays the request's control: its deadline, its status, its Final, and cancel =
cancel the call. `DeliveryReader.infer` starts the call; while the endpoint's stream is not open
yet (its first calls), or its worker does not know `Deliver` (an older version), the call carries
its deltas itself as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import itertools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.errors import ErrorDetails

log = logging.getLogger(__name__)
REOPEN_AFTER_S = 1.0  # a stream that broke is opened again (by a call) no sooner than this
ASK_AGAIN_S = 60.0  # a worker without Deliver is asked again after this (it may be upgraded in place)
_CALL_ENDED = object()
_CANCELLED = object()
CALL_END_WAIT_S = 1.0  # a call whose delivery stream broke waits this long for its own end (`_settle`)
DELIVERED = "delivered"  # ErrorInfo metadata: the deltas a failed call sent on the delivery stream first
# A call whose reader leaves this many items unread (its client stopped reading) gets later deltas
# merged into its last one: what it holds grows with the text, not by a message per token (the
# per-call gRPC flow window bounded it before deltas shared a stream; vLLM's server merges too).
COALESCE_AFTER = 64
MAX_CHOICES = 16  # choices per request a worker runs (`n`): how far back a delta looks for its choice's last


class StreamEnded:
    """Queued to each of its calls when a delivery stream ends. Broken (an error): a call that has
    not read its Final fails UNAVAILABLE, as when a connection breaks. Ended by the worker (it
    stops, once no call sends on it): each call's Final still comes on the call."""

    def __init__(self, cause: str, broken: bool) -> None:
        self.cause, self.broken = cause, broken

    def error(self) -> grpc.aio.AioRpcError:
        """A fresh error for each call: one object raised in many tasks would gather all their
        tracebacks, and hold their frames."""
        return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                    f"the worker's delivery stream ended: {self.cause}")


def ended_here(why: str) -> grpc.aio.AioRpcError:
    """The error of a call that gRPC ended on the caller's side (its channel closed under it): a
    dropped call, CANCELLED with no reason (a 503, tried elsewhere before the first token)."""
    return grpc.aio.AioRpcError(grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                f"the call was ended here: {why}")


def delivered_before(error: BaseException) -> int:
    """How many deltas the worker sent on the delivery stream before the call failed (its
    `ErrorInfo` says, services/worker/servicer.py): the error waits for them as a Final does."""
    if not isinstance(error, grpc.aio.AioRpcError):
        return 0
    return int(ErrorDetails.from_rpc_error(error).metadata.get(DELIVERED, 0))


class Merged:
    """Deltas of one choice merged into one event: `count` of them, as the worker counted them."""

    __slots__ = ("count", "event")

    def __init__(self, event: pb.InferEvent, count: int) -> None:
        self.event, self.count = event, count


def merge(into: pb.InferEvent, delta: pb.InferEvent) -> bool:
    """Append `delta`'s text, reasoning and logprobs to `into`'s, when that keeps the stream's
    meaning: the same choice, no tool-call fragments, no reasoning after text."""
    a, b = into.delta, delta.delta
    if a.index != b.index or a.tool_calls or b.tool_calls or (a.text and b.reasoning):
        return False
    a.text += b.text
    a.reasoning += b.reasoning
    a.token_count += b.token_count
    if b.logprobs:
        a.logprobs.extend(b.logprobs)
    return True


class CallEvents:
    """One call's events in order (what asyncio.Queue offers it), merging deltas that come while
    COALESCE_AFTER items wait (`Merged`)."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        items = self._items
        if len(items) >= COALESCE_AFTER and self._merged(item):
            return
        items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _merged(self, item: Any) -> bool:
        """Into the last waiting delta of its choice (choices interleave when n > 1)."""
        if not isinstance(item, pb.InferEvent) or not item.HasField("delta"):
            return False
        items = self._items
        for back in range(1, min(len(items), MAX_CHOICES) + 1):
            waiting = items[-back]
            event = waiting.event if isinstance(waiting, Merged) else waiting
            if not isinstance(event, pb.InferEvent) or not event.HasField("delta"):
                return False  # never across the call's Final, an error or the stream's end
            if event.delta.index == item.delta.index:
                if not merge(event, item):
                    return False
                if isinstance(waiting, Merged):
                    waiting.count += 1
                else:
                    items[-back] = Merged(event, 2)
                return True
        return False

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def get_nowait(self) -> Any:
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class DeliveredCall:
    """An Infer call whose deltas come on its endpoint's delivery stream. Read like the call itself
    (`read()`: the next event, `grpc.aio.EOF` at the end, `AioRpcError` on failure; `cancel()`): the
    deltas, then what the call sends (its Final, or its error), in one queue. The two streams are
    not ordered with each other, so the Final, or an error the worker raised after sending deltas,
    waits until every delta it counts has been read."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, reader: DeliveryReader, tag: int,
                 queue: CallEvents) -> None:
        self._call, self._reader, self._tag, self._queue = call, reader, tag, queue
        self._deltas = 0  # delta events read so far
        self._held: Any = None  # the call's Final or error, held until `_deltas` reaches `_count`
        self._count = 0
        self._call_ended = False
        self._final_read = False
        self._cancelled = False
        self._stream_ended: StreamEnded | None = None  # the delivery stream ended meanwhile
        self._on_call = False  # the worker sends this call's deltas on the call itself (it did not know the stream)
        self._follower = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        """What the call itself sends goes to the same queue, and always how it ended: a reader
        must never wait on a call whose follower died."""
        put, final = self._queue.put_nowait, False
        try:
            while (event := await self._call.read()) is not grpc.aio.EOF:
                final = event.HasField("final")
                self._on_call = self._on_call or not final
                put(event)
        except grpc.aio.AioRpcError as e:
            put(e)
            return
        except (asyncio.CancelledError, grpc.aio.UsageError) as e:
            if not self._cancelled:  # gRPC ended the call here (its channel closed), not our cancel()
                put(_CALL_ENDED if final else ended_here(type(e).__name__))  # after the Final: the answer is whole
            raise
        put(_CALL_ENDED)

    async def read(self) -> Any:
        while True:
            if self._cancelled:  # as a cancelled grpc.aio call's read() does
                raise asyncio.CancelledError()
            held = self._held
            if held is not None and self._deltas >= self._count:
                self._held = None
                if isinstance(held, BaseException):
                    raise self._failed(held)
                self._final_read = True
                return held
            if self._call_ended and held is None:
                self._reader.detach(self._tag)
                return grpc.aio.EOF
            item = await self._queue.get()
            if item is _CALL_ENDED:
                self._call_ended = True
            elif item is _CANCELLED:
                continue
            elif isinstance(item, StreamEnded):
                self._stream_ended = item
                if item.broken and not self._final_read and not self._on_call:
                    await self._settle()  # deltas may have been lost with it, unless its Final says otherwise
                    if not (self._holds_final() and self._deltas >= self._count):
                        raise self._failed(self._held if isinstance(self._held, BaseException) else item.error())
            elif isinstance(item, Merged):
                self._deltas += item.count
                return item.event
            elif isinstance(item, BaseException) or item.HasField("final"):
                self._hold(item)
            else:
                self._deltas += 1
                return item
            ended = self._stream_ended
            if ended is not None and self._held is not None and self._deltas < self._count:
                await self._settle()  # deltas it counts will not come any more
                raise self._failed(self._held if isinstance(self._held, BaseException) else ended.error())

    def _holds_final(self) -> bool:
        return isinstance(self._held, pb.InferEvent)

    def _hold(self, end: Any) -> None:
        """The call's Final or error, until every delta it counts was read. An error after the
        Final (a deadline before the trailers) leaves the answer whole."""
        if isinstance(end, BaseException):
            if not self._holds_final():
                self._held, self._count = end, delivered_before(end)
        else:
            self._held, self._count = end, end.final.delivered

    async def _settle(self) -> None:
        """The delivery stream ended while this call ran: take what the call itself sent since (its
        Final, its error: it fails with its own error, not the stream's). The call's end is waited
        for (briefly): when the connection broke, the delivery stream, which was sending, usually
        learns it first, and a call made again at once on the same replica would go out on the dead
        connection before the channel dropped it. (No delta comes after the stream's end: a call's
        deltas come all on the stream or all on the call.)"""
        if not self._follower.done():
            await asyncio.wait({self._follower}, timeout=CALL_END_WAIT_S)
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is _CALL_ENDED:
                self._call_ended = True
            elif isinstance(item, BaseException) or (isinstance(item, pb.InferEvent) and item.HasField("final")):
                self._hold(item)

    def _failed(self, error: BaseException) -> BaseException:
        self._reader.detach(self._tag)
        return error

    def cancel(self) -> bool:
        self._cancelled = True
        self._reader.detach(self._tag)
        self._follower.cancel()
        self._queue.put_nowait(_CANCELLED)  # wakes a read() waiting in another task
        return self._call.cancel()


class DeliveryReader:
    """One endpoint's delivery stream: opened by the first call that would use it, read by one task
    that hands each delta to its call's queue (by the call's tag), opened again after it broke."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub) -> None:
        self._stub = stub
        self._id = ""  # the open stream's id ("": not open yet, or broken)
        self._task: asyncio.Task[None] | None = None
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._queues: dict[int, Callable[[Any], None]] = {}  # tag -> its call's queue's put
        self._tags = itertools.count(1)
        self._reopen_at = 0.0  # no stream is opened before this (loop time)
        self._retired = False  # the endpoint left the routes: end the stream once its calls ended

    @property
    def is_open(self) -> bool:
        return bool(self._id)

    def infer(self, request: pb.InferRequest, **kwargs: Any) -> grpc.aio.UnaryStreamCall | DeliveredCall:
        """Start an Infer call (`kwargs`: the stub's: timeout, metadata) on the delivery stream when
        it is open; on the call alone otherwise."""
        if not self._id:
            self._open()
            request.ClearField("delivery")
            return self._stub.Infer(request, **kwargs)
        tag = next(self._tags)
        request.delivery.id, request.delivery.tag = self._id, tag
        queue = CallEvents()
        self._queues[tag] = queue.put_nowait  # before the call starts: its first delta may come at once
        try:
            return DeliveredCall(self._stub.Infer(request, **kwargs), self, tag, queue)
        except BaseException:
            self.detach(tag)
            raise

    def detach(self, tag: int) -> None:
        self._queues.pop(tag, None)
        self._end_if_retired()

    def retire(self) -> None:
        """The endpoint left the routes: no new call uses the stream; it ends after the last one."""
        self._retired, self._id = True, ""
        self._end_if_retired()

    def _end_if_retired(self) -> None:
        if self._retired and not self._queues and self._call is not None:
            self._call.cancel()

    def _open(self) -> None:
        if self._task is not None or self._retired:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._reopen_at:  # its own context: not the trace or request id of the call opening it
            self._task = loop.create_task(self._run(), context=contextvars.Context())

    async def _run(self) -> None:
        cause, broken, reopen_after = "cancelled", True, REOPEN_AFTER_S
        try:
            self._call = call = self._stub.Deliver(pb.DeliverRequest())
            first = await call.read()
            if first is grpc.aio.EOF or self._retired:
                return
            self._id = first.delivery_id
            queues = self._queues
            while (batch := await call.read()) is not grpc.aio.EOF:
                for tag, event in zip(batch.tags, batch.events, strict=True):
                    put = queues.get(tag)
                    if put is not None:  # else: its call was cancelled here meanwhile
                        put(event)
            cause, broken = "the worker ended it", False
        except grpc.aio.UsageError:
            cause = "its channel is closed"  # the endpoint just left the routes
        except grpc.aio.AioRpcError as e:
            cause = f"{e.code().name} {e.details()}"
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                reopen_after = ASK_AGAIN_S  # an older worker: its calls carry their deltas meanwhile
            else:
                log.info("a delivery stream ended: %s", cause)
        finally:
            if self._call is not None:
                self._call.cancel()  # a no-op once it ended; else it would hold its channel's close
            self._id, self._task, self._call = "", None, None
            self._reopen_at = asyncio.get_running_loop().time() + reopen_after
            ended = StreamEnded(cause, broken)
            for put in self._queues.values():
                put(ended)
            self._queues.clear()
