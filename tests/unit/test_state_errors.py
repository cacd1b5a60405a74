"""The state service's gRPC error edge: every `ServiceError` kind raised by a handler (unary or
streaming) reaches the client whole through the real server construction (`state_server`: the
ErrorInterceptor), and so do the store's own refusals through the real StateServicer."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.errors import ServiceError
from services.state.memory_store import MemoryStore
from services.state.server import state_server
from services.state.servicer import StateServicer
from tests.grpc_serving import failure_of, serving, stream_failure_of
from tests.rpc_errors import ERROR_KINDS, assert_carries

KEY = pb.ResponseKey(identity="alice", response_id="r")


class RaisingState(state_pb2_grpc.StateServicer):
    """Raises `error` from GetResponse (unary) and ReadEvents (streaming, after one event)."""

    def __init__(self, error: ServiceError) -> None:
        self.error = error

    async def GetResponse(self, request: pb.GetResponseRequest, context) -> pb.StoredResponse:
        raise self.error

    async def ReadEvents(self, request: pb.ReadEventsRequest, context) -> AsyncIterator[pb.RunEvent]:
        yield pb.RunEvent(sequence=1)
        raise self.error


@pytest.fixture(params=sorted(ERROR_KINDS))
def error(request: pytest.FixtureRequest) -> ServiceError:
    return ERROR_KINDS[request.param]


async def test_every_error_kind_reaches_the_client_whole(error: ServiceError):
    async with serving(state_server(RaisingState(error))) as channel:
        stub = state_pb2_grpc.StateStub(channel)
        assert_carries(await failure_of(stub.GetResponse(pb.GetResponseRequest(key=KEY))), error)
        sent, err = await stream_failure_of(stub.ReadEvents(pb.ReadEventsRequest(key=KEY)))
        assert [e.sequence for e in sent] == [1]
        assert_carries(err, error)


async def test_the_stores_refusals_travel_intact():
    """A Conflict and a NotFound as the store raises them, and as a client of the service gets them."""
    store = MemoryStore()
    async with serving(state_server(StateServicer(store))) as channel:
        await refusals_travel_intact(store, state_pb2_grpc.StateStub(channel))


async def refusals_travel_intact(store: MemoryStore, stub: state_pb2_grpc.StateStub) -> None:
    await store.create_run(pb.StoredResponse(key=KEY), owner="gw1", lease_s=30)
    with pytest.raises(ServiceError) as conflict:  # refused: nothing changes, so it can be asked again
        await store.set_run_status("alice", "r", pb.RUN_STATUS_COMPLETED, expected=[pb.RUN_STATUS_IN_PROGRESS])
    assert_carries(await failure_of(stub.SetRunStatus(pb.SetRunStatusRequest(
        key=KEY, status=pb.RUN_STATUS_COMPLETED, expected=[pb.RUN_STATUS_IN_PROGRESS]))), conflict.value)
    bobs = pb.ResponseKey(identity="bob", response_id="r")
    with pytest.raises(ServiceError) as missing:
        await store.append_events("bob", "r", [pb.RunEvent(event_json="{}")])
    assert_carries(await failure_of(stub.AppendEvents(pb.AppendEventsRequest(
        key=bobs, events=[pb.RunEvent(event_json="{}")]))), missing.value)
    sent, err = await stream_failure_of(stub.ReadEvents(pb.ReadEventsRequest(key=bobs)))
    assert sent == []
    assert_carries(err, missing.value)
