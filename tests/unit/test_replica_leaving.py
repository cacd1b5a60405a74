"""A replica that leaves the routes while it still serves (a cut-over's drain, a heartbeat missed):
its calls in flight go on and its channel closes once they ended; a call that outlives the bound
(`RETIRED_CHANNEL_MAX_S`) ends as a dropped call (CANCELLED, no reason: a 503), not as a bare
cancellation that would cut a stream without its error event or `[DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common import routes
from services.common.delivery import DeliveredCall
from services.common.infer import InferStream, UpstreamError, open_infer
from services.common.routes import RouteTable
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.unit.test_infer import MODEL, opened, request, routing


@pytest.fixture
async def worker() -> AsyncIterator[ServedWorker]:
    served = await serve_worker(ScriptedEngine(["a", "b", "c"]), name=MODEL)
    try:
        yield served
    finally:
        served.engine.hold.set()
        await served.server.stop(0)


async def held_stream(worker: ServedWorker, table: RouteTable, delivered: bool) -> InferStream:
    """A stream parked before its last chunk, on the endpoint's delivery stream or on the call."""
    if delivered:
        await opened(table)
    worker.engine.hold.clear()
    stream = await open_infer(table, MODEL, request("long"))
    assert isinstance(stream._call, DeliveredCall) == delivered
    return stream


def leave(table: RouteTable) -> None:
    table.apply(cpb.RoutingSnapshot(version=table.version + 1))  # the model's replica left the routes


@pytest.mark.parametrize("delivered", [False, True])
async def test_calls_on_a_replica_that_left_go_on_and_its_channel_closes_after_them(
        worker: ServedWorker, delivered: bool) -> None:
    table = routing(worker.port)
    try:
        stream = await held_stream(worker, table, delivered)
        leave(table)
        assert table._probes  # its channel waits for the call
        worker.engine.hold.set()
        assert [e.WhichOneof("event") async for e in stream] == ["delta", "delta", "delta", "final"]
        stream.close()
        await until(lambda: not table._probes, "the channel closed once its call ended")
    finally:
        await table.close()


@pytest.mark.parametrize("delivered", [False, True])
async def test_a_call_that_outlives_the_bound_ends_as_a_dropped_call(
        worker: ServedWorker, delivered: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "RETIRED_CHANNEL_MAX_S", 0.2)
    table = routing(worker.port)
    try:
        stream = await held_stream(worker, table, delivered)
        leave(table)
        with pytest.raises(UpstreamError) as e:
            async for _ in stream:
                pass
        stream.close()
        assert e.value.details.code == grpc.StatusCode.CANCELLED and e.value.details.dropped
    finally:
        await table.close()
