"""The Python client (`MshipClient`) against stand-in coordinators and a worker (real grpc.aio servers
on loopback): `async with` retries a coordinator that is not there yet, ends at once on a refusal no
retry changes, and leaves no routing watch behind however its wait ends; `embed()` has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from clients.client import MshipClient, MshipError
from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from mship.worker.v1 import worker_pb2_grpc
from services.common.interceptors import TokenAuthInterceptor
from services.common.vocabulary import ENV_RAY_AUTH_TOKEN

pytestmark = pytest.mark.timeout(60)
TOKEN = "s3cret-token"


class Coordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """WatchRouting only: refuses the first `unavailable` watches as UNAVAILABLE (a coordinator
    restarting), then sends `snapshot` (None: nothing) and keeps the watch open; notes each watch."""

    def __init__(self, snapshot: cpb.RoutingSnapshot | None = None, unavailable: int = 0) -> None:
        self.snapshot, self.unavailable = snapshot, unavailable
        self.watches = 0
        self.watching = asyncio.Event()  # a watch is open
        self.closed = asyncio.Event()  # the client closed it

    async def WatchRouting(self, request, context):
        self.watches += 1
        if self.watches <= self.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the coordinator is restarting")
        self.watching.set()
        try:
            if self.snapshot is not None:
                yield cpb.RoutingUpdate(snapshot=self.snapshot)
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.closed.set()
            raise


class HungWorker(worker_pb2_grpc.WorkerServicer):
    """A worker whose Embed never answers; notes when the caller gives the call up."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def Embed(self, request, context):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@contextlib.asynccontextmanager
async def listening(server: grpc.aio.Server) -> AsyncIterator[str]:
    """Start `server` on a free loopback port; its address; stopped after."""
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def coordinator_server(coordinator: Coordinator, *interceptors: grpc.aio.ServerInterceptor) -> grpc.aio.Server:
    server = grpc.aio.server(interceptors=interceptors or None)
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(coordinator, server)
    return server


def routes_to(model: str, port: int) -> cpb.RoutingSnapshot:
    replica = cpb.ReplicaInfo(replica_id="r1", model=model, version="v1",
                              endpoint=common_pb2.Endpoint(host="127.0.0.1", port=port))
    return cpb.RoutingSnapshot(version=1, models=[cpb.ModelRoute(name=model, version="v1", replicas=[replica])])


@pytest.fixture(autouse=True)
def no_platform_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_RAY_AUTH_TOKEN, raising=False)  # clients send only what a test gives them


def watching(client: MshipClient) -> bool:
    """Whether the client's routing watch still runs (it would reconnect forever)."""
    task = client._watcher._task
    return task is not None and not task.done()


@pytest.mark.parametrize("how", ["cancelled", "the caller's deadline"])
async def test_a_caller_giving_up_while_the_client_waits_for_routes_leaves_no_watch_behind(how):
    coordinator = Coordinator()  # never sends a routing table
    async with listening(coordinator_server(coordinator)) as address:
        client = MshipClient(address, ready_timeout_s=60)
        deadline = asyncio.timeout(None)  # the caller's own, around `async with`

        async def caller() -> None:
            async with deadline, client:
                pytest.fail("entered without a routing table")

        task = asyncio.create_task(caller())
        await asyncio.wait_for(coordinator.watching.wait(), 10)
        if how == "cancelled":
            task.cancel()
        else:
            deadline.reschedule(asyncio.get_running_loop().time())
        with pytest.raises(asyncio.CancelledError if how == "cancelled" else TimeoutError):
            await task
        await asyncio.wait_for(coordinator.closed.wait(), 5)  # the watch was closed, not kept
        assert not watching(client) and coordinator.watches == 1


@pytest.mark.parametrize("refusal", ["a wrong token", "not the coordinator"])
async def test_a_refusal_no_retry_changes_is_an_error_at_once(refusal):
    if refusal == "a wrong token":
        server, token = coordinator_server(Coordinator(cpb.RoutingSnapshot()), TokenAuthInterceptor(TOKEN)), "wrong"
    else:  # e.g. the state port: a gRPC server without the coordinator's service
        server, token = grpc.aio.server(), None
    async with listening(server) as address:
        client = MshipClient(address, token=token, ready_timeout_s=60)
        with pytest.raises(MshipError) as refused:
            async with asyncio.timeout(10):  # well within ready_timeout_s: not retried until then
                async with client:
                    pytest.fail("entered")
    details = refused.value.details
    if refusal == "a wrong token":
        assert details.code == grpc.StatusCode.UNAUTHENTICATED
        assert f"the coordinator at {address} refused a wrong token" in details.message
        assert ENV_RAY_AUTH_TOKEN in details.message
    else:
        assert details.code == grpc.StatusCode.UNIMPLEMENTED
        assert f"{address} does not serve the coordinator's API" in details.message
    assert not watching(client)


async def test_a_coordinator_not_serving_yet_is_retried_until_it_sends_routes():
    coordinator = Coordinator(routes_to("m", 1), unavailable=2)
    async with listening(coordinator_server(coordinator)) as address:
        async with MshipClient(address, ready_timeout_s=30) as client:
            assert client.models() == ["m"] and coordinator.watches == 3
        assert not watching(client)


async def test_embed_ends_at_its_deadline_on_a_worker_that_hangs():
    worker = HungWorker()
    worker_server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, worker_server)
    async with listening(worker_server) as worker_address:
        coordinator = Coordinator(routes_to("e", int(worker_address.rsplit(":", 1)[1])))
        async with listening(coordinator_server(coordinator)) as address, MshipClient(address) as client:
            with pytest.raises(MshipError) as failed:
                async with asyncio.timeout(10):
                    await client.embed("e", ["hello"], timeout_s=0.2)
            assert failed.value.details.code == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(worker.cancelled.wait(), 5)  # the worker's call ended too
