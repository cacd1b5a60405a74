"""Backpressure in a worker replica: at most `max_ongoing_requests` requests reach the engine at
once, at most `max_queued_requests` more wait (first come, first served) for one of those places,
and anything past both is refused at once with OVERLOADED and a retry delay, instead of queueing
without bound. The edge then tries another replica, or answers 503 with Retry-After.

Limits can change while requests run (the coordinator hands out the model's current limits in
heartbeat replies): a raised limit admits waiters at once, a lowered one lets running requests
finish and admits no one until the count is under it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator

import grpc

from mship.common.v1 import common_pb2
from services.common.errors import Reason, ServiceError
from services.common.limits import replica_limits

RETRY_AFTER_S = 1.0


class RequestGate:
    def __init__(self, limits: common_pb2.ReplicaLimits | None = None) -> None:
        self.limits = limits or replica_limits(None)
        self.ongoing = 0
        self._waiting: OrderedDict[str, asyncio.Future[None]] = OrderedDict()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def apply(self, limits: common_pb2.ReplicaLimits) -> None:
        self.limits = common_pb2.ReplicaLimits()
        self.limits.CopyFrom(limits)
        self._admit_waiters()

    @contextlib.asynccontextmanager
    async def admitted(self, request_id: str) -> AsyncIterator[None]:
        """Hold one engine place for the body; wait for one if the queue has room; else OVERLOADED."""
        if self.ongoing < self.limits.max_ongoing_requests and not self._waiting:
            self.ongoing += 1
        elif len(self._waiting) < self.limits.max_queued_requests:
            await self._wait(request_id)
        else:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED,
                               f"this replica is at its limits ({self.limits.max_ongoing_requests} running, "
                               f"{self.limits.max_queued_requests} queued)", retry_after_s=RETRY_AFTER_S)
        try:
            yield
        finally:
            self.ongoing -= 1
            self._admit_waiters()

    def cancel_waiting(self, request_id: str) -> bool:
        """End a queued request before it reaches the engine (Cancel by id); False if it is not queued."""
        future = self._waiting.pop(request_id, None)
        if future is None or future.done():
            return False
        future.set_exception(ServiceError(grpc.StatusCode.CANCELLED, Reason.ERROR_REASON_UNSPECIFIED,
                                          "cancelled while queued"))
        return True

    async def _wait(self, request_id: str) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            await future  # _admit_waiters counted this request in `ongoing` before resolving it
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.ongoing -= 1  # admitted just as the caller went away: give the place on
                self._admit_waiters()
            elif self._waiting.get(request_id) is future:  # not a newer call's place under the same id
                del self._waiting[request_id]
            raise

    def _admit_waiters(self) -> None:
        while self._waiting and self.ongoing < self.limits.max_ongoing_requests:
            _, future = self._waiting.popitem(last=False)
            if not future.done():
                self.ongoing += 1
                future.set_result(None)
