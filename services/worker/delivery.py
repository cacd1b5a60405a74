"""The worker's delivery streams (`Deliver`): one per caller, carrying the deltas of every Infer call
that names it, whatever is ready in one message.

A call's handler hands its deltas to the stream (`Delivery.send`, never waiting); the stream's own
handler wakes once for everything handed over meanwhile and sends it as one `DeliveryBatch`. While
gRPC is still writing the previous batch the next one grows, so the worker sends one message per
engine step and not one per token and stream, and fewer still when the caller lags. A delta that
finds its call's last one still waiting (gRPC still writing: the caller lags) is merged into it, so
what waits grows with the calls, not by an event per token; the Final counts the events that went
out. The calls keep their own control (deadline, status, Final, cancel = cancel the call).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc

from mship.worker.v1 import worker_pb2 as pb
from services.common.delivery import merge
from services.common.errors import Reason, ServiceError

MAX_BATCH = 1024  # events per message: a batch stays far below the caller's message size limit


class Delivery:
    """One open delivery stream."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.attached = 0  # Infer calls sending on it now
        self._tags: list[int] = []
        self._events: list[pb.InferEvent] = []
        self._waiting: dict[tuple[int, int], pb.InferEvent] = {}  # (tag, choice) -> its last event in `_events`
        self._ready = asyncio.Event()
        self._ended = False  # the stream's call ended: nothing more goes out on it
        self._closing = False  # the worker stops: end the stream once no call is attached

    def send(self, tag: int, event: pb.InferEvent) -> bool:
        """Hand a call's delta over. False: it was merged into the call's last delta of its choice,
        still waiting to go out (one event fewer for the Final's count)."""
        if self._ended:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.ERROR_REASON_UNSPECIFIED,
                               "the delivery stream this call sends on has ended")
        key = (tag, event.delta.index)
        waiting = self._waiting.get(key)
        if waiting is not None and merge(waiting, event):
            return False
        self._waiting[key] = event
        self._tags.append(tag)
        self._events.append(event)
        self._ready.set()
        return True

    def end(self) -> None:
        self._ended = True

    def detach(self) -> None:
        self.attached -= 1
        if self._closing and not self.attached:
            self._ready.set()

    def close_when_idle(self) -> None:
        self._closing = True
        self._ready.set()

    async def batches(self) -> AsyncIterator[pb.DeliveryBatch]:
        yield pb.DeliveryBatch(delivery_id=self.id)
        ready = self._ready
        while True:
            await ready.wait()
            ready.clear()
            tags, events = self._tags, self._events
            self._tags, self._events, self._waiting = [], [], {}  # taken: nothing merges into them any more
            for at in range(0, len(events), MAX_BATCH):  # one message, unless a lagging caller let it grow
                yield pb.DeliveryBatch(tags=tags[at:at + MAX_BATCH], events=events[at:at + MAX_BATCH])
            if self._closing and not self.attached and not self._events:
                return


class Deliveries:
    """The delivery streams open on this worker, by id."""

    def __init__(self) -> None:
        self._open: dict[str, Delivery] = {}
        self._closing = False

    def attach(self, request: pb.InferRequest) -> Delivery | None:
        """The stream an Infer call's deltas go on; None: on the call (none asked, or not open here)."""
        if not request.HasField("delivery"):
            return None
        delivery = self._open.get(request.delivery.id)
        if delivery is not None:
            delivery.attached += 1
        return delivery

    async def serve(self) -> AsyncIterator[pb.DeliveryBatch]:
        """A Deliver call: open a stream, send its batches until the caller ends it (or the worker stops)."""
        delivery = Delivery()
        if self._closing:
            delivery.close_when_idle()
        self._open[delivery.id] = delivery
        try:
            async for batch in delivery.batches():
                yield batch
        finally:
            del self._open[delivery.id]
            delivery.end()

    def close_when_idle(self) -> None:
        """The worker stops: end each stream once no call sends on it (the server's grace would
        otherwise wait for streams that never end by themselves)."""
        self._closing = True
        for delivery in self._open.values():
            delivery.close_when_idle()
