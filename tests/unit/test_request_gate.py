"""Backpressure in a worker replica (services/worker/request_gate.py): places, a bounded FIFO queue,
an immediate refusal past both, cancellation while queued, limits changed while requests run."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from mship.common.v1 import common_pb2
from services.common.errors import Reason, ServiceError
from services.common.limits import DEFAULT_MAX_ONGOING_REQUESTS, DEFAULT_MAX_QUEUED_REQUESTS, replica_limits
from services.worker.request_gate import RequestGate


def gate(ongoing: int, queued: int) -> RequestGate:
    return RequestGate(common_pb2.ReplicaLimits(max_ongoing_requests=ongoing, max_queued_requests=queued))


class Holder:
    """A request that holds its place until released; `admitted` is set once it has one."""

    def __init__(self, g: RequestGate, request_id: str) -> None:
        self.admitted, self.release = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(self._run(g, request_id))

    async def _run(self, g: RequestGate, request_id: str) -> None:
        async with g.admitted(request_id):
            self.admitted.set()
            await self.release.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_places_then_a_fifo_queue_then_an_immediate_refusal():
    g = gate(2, 2)
    held = [Holder(g, f"r{i}") for i in range(4)]
    await settle()
    assert [h.admitted.is_set() for h in held] == [True, True, False, False]
    assert (g.ongoing, g.queued) == (2, 2)
    with pytest.raises(ServiceError) as info:
        async with g.admitted("r4"):
            pass
    assert (info.value.code, info.value.reason, info.value.retry_after_s) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED, 1.0)
    held[1].release.set()
    await settle()
    assert [h.admitted.is_set() for h in held] == [True, True, True, False]  # first queued, first in
    for h in held:
        h.release.set()
    await asyncio.gather(*(h.task for h in held))
    assert (g.ongoing, g.queued) == (0, 0)


async def test_a_request_cancelled_while_queued_leaves_the_queue_and_one_cancelled_by_id_ends():
    g = gate(1, 3)
    first, waiting, by_id = Holder(g, "a"), Holder(g, "b"), Holder(g, "c")
    await settle()
    assert g.queued == 2
    waiting.task.cancel()  # its client went away
    await settle()
    assert g.queued == 1
    assert g.cancel_waiting("c") and not g.cancel_waiting("a")  # running ones are the engine's to abort
    with pytest.raises(ServiceError) as info:
        await by_id.task
    assert info.value.code == grpc.StatusCode.CANCELLED
    first.release.set()
    await first.task
    assert (g.ongoing, g.queued) == (0, 0)


async def test_a_waiter_admitted_as_it_is_cancelled_hands_its_place_on():
    g = gate(1, 2)
    first, second, third = Holder(g, "a"), Holder(g, "b"), Holder(g, "c")
    await settle()
    first.release.set()
    await first.task  # hands its place to `b`: b's future is resolved, b has not run yet
    second.task.cancel()
    await settle()
    assert third.admitted.is_set() and g.ongoing == 1
    third.release.set()
    with contextlib.suppress(asyncio.CancelledError):
        await second.task
    await third.task
    assert (g.ongoing, g.queued) == (0, 0)


async def test_a_waiter_leaving_never_takes_a_newer_waiters_place_under_its_id():
    g = gate(1, 3)
    first, older = Holder(g, "a"), Holder(g, "e")
    await settle()
    newer = Holder(g, "e")  # the same id queued again (the servicer supersedes first; the gate holds anyway)
    await settle()
    older.task.cancel()
    await settle()
    assert g.queued == 1  # the newer one's place is kept
    first.release.set()
    await asyncio.wait_for(newer.admitted.wait(), 5)
    newer.release.set()
    await newer.task
    assert (g.ongoing, g.queued) == (0, 0)


async def test_raised_limits_admit_waiters_at_once_and_lowered_ones_admit_nobody_until_under():
    g = gate(1, 4)
    held = [Holder(g, f"r{i}") for i in range(3)]
    await settle()
    g.apply(common_pb2.ReplicaLimits(max_ongoing_requests=3, max_queued_requests=4))
    await settle()
    assert all(h.admitted.is_set() for h in held)
    g.apply(common_pb2.ReplicaLimits(max_ongoing_requests=1, max_queued_requests=4))
    late = Holder(g, "late")
    held[0].release.set()
    await settle()
    assert not late.admitted.is_set()  # 2 still run, over the new limit of 1
    for h in held[1:]:
        h.release.set()
    await settle()
    assert late.admitted.is_set()
    late.release.set()
    await asyncio.gather(late.task, *(h.task for h in held))


def test_limits_default_and_a_zero_queue_is_kept():
    assert replica_limits(None) == replica_limits(common_pb2.ModelSpec()) == common_pb2.ReplicaLimits(
        max_ongoing_requests=DEFAULT_MAX_ONGOING_REQUESTS, max_queued_requests=DEFAULT_MAX_QUEUED_REQUESTS)
    spec = common_pb2.ModelSpec(max_ongoing_requests=2, max_queued_requests=0)
    assert replica_limits(spec) == common_pb2.ReplicaLimits(max_ongoing_requests=2, max_queued_requests=0)
