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
CALL_END_WAIT_S = 1.0  # a call whose delivery stream broke waits this long for its own end (`_cause`)
DELIVERED = "delivered"  # ErrorInfo metadata: the deltas a failed call sent on the delivery stream first


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


class DeliveredCall:
    """An Infer call whose deltas come on its endpoint's delivery stream. Read like the call itself
    (`read()`: the next event, `grpc.aio.EOF` at the end, `AioRpcError` on failure; `cancel()`): the
    deltas, then what the call sends (its Final, or its error), in one queue. The two streams are
    not ordered with each other, so the Final, or an error the worker raised after sending deltas,
    waits until every delta it counts has been read."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, reader: DeliveryReader, tag: int,
                 queue: asyncio.Queue[Any]) -> None:
        self._call, self._reader, self._tag, self._queue = call, reader, tag, queue
        self._deltas = 0  # delta events read so far
        self._held: Any = None  # the call's Final or error, held until `_deltas` reaches `_count`
        self._count = 0
        self._call_ended = False
        self._final_read = False
        self._cancelled = False
        self._stream_ended: StreamEnded | None = None  # the delivery stream ended meanwhile
        self._follower = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        """What the call itself sends goes to the same queue, and always how it ended: a reader
        must never wait on a call whose follower died."""
        put, final = self._queue.put_nowait, False
        try:
            while (event := await self._call.read()) is not grpc.aio.EOF:
                final = event.HasField("final")
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
            elif isinstance(item, StreamEnded):
                self._stream_ended = item
                if item.broken and not self._final_read:
                    raise self._failed(await self._cause(item))  # deltas may have been lost with it
            elif isinstance(item, BaseException):
                self._held, self._count = item, delivered_before(item)
            elif not item.HasField("final"):
                self._deltas += 1
                return item
            else:
                self._held, self._count = item, item.final.delivered
            if self._stream_ended is not None and self._held is not None and self._deltas < self._count:
                raise self._failed(await self._cause(self._stream_ended))  # deltas it counts will not come any more

    async def _cause(self, ended: StreamEnded) -> BaseException:
        """Why a call whose delivery stream ended fails: its own error if it has one, else the
        stream's. The call's own end is waited for (briefly): when the connection broke, the delivery
        stream, which was sending, usually learns it first, and a call made again at once on the
        same replica would go out on the dead connection before the channel dropped it."""
        if not self._follower.done():
            await asyncio.wait({self._follower}, timeout=CALL_END_WAIT_S)
        while not isinstance(self._held, BaseException) and not self._queue.empty():
            if isinstance(item := self._queue.get_nowait(), BaseException):
                self._held = item
        return self._held if isinstance(self._held, BaseException) else ended.error()

    def _failed(self, error: BaseException) -> BaseException:
        self._reader.detach(self._tag)
        return error

    def cancel(self) -> bool:
        self._cancelled = True
        self._reader.detach(self._tag)
        self._follower.cancel()
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
        queue: asyncio.Queue[Any] = asyncio.Queue()
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
