"""A worker replica's standing with the coordinator, over a real grpc.aio server on 127.0.0.1 whose
servicer stands in for the coordinator (its lease bookkeeping is the coordinator's own
`LeaseManager`; `restart` forgets everything, as a restarted coordinator does): the registrar's
heartbeats and re-registration, and the node's load lease held by the worker's real `node_lease`.
"""

from __future__ import annotations

import asyncio
import inspect
import types
from collections.abc import AsyncIterator

import grpc
import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.coordinator.leases import LeaseManager
from services.worker import llama_server, registration
from services.worker.registration import Registrar, node_lease

pytestmark = pytest.mark.timeout(30)
REPLICA = pb.ReplicaInfo(replica_id="r1", model="m", endpoint=common_pb2.Endpoint(host="127.0.0.1", port=1))


class FakeCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self) -> None:
        self.leases = LeaseManager()
        self.replicas: set[str] = set()
        self.granted: asyncio.Queue[str] = asyncio.Queue()  # holders, as leases are granted
        self.renewed: asyncio.Queue[str] = asyncio.Queue()  # holders, as renewals are granted
        self.registered: asyncio.Queue[str] = asyncio.Queue()
        self.beats: asyncio.Queue[pb.HeartbeatRequest] = asyncio.Queue()
        self.routed = False  # what a leaving replica is told

    def restart(self) -> None:
        self.leases, self.replicas = LeaseManager(), set()

    async def AcquireLease(self, request: pb.AcquireLeaseRequest, context) -> pb.Lease:
        lease = await self.leases.acquire(request.node_id, request.holder, request.ttl_s, request.wait_s)
        if lease is None:
            return pb.Lease(granted=False, node_id=request.node_id)
        self.granted.put_nowait(request.holder)
        return pb.Lease(lease_id=lease.lease_id, granted=True, node_id=lease.node_id, holder=lease.holder)

    async def RenewLease(self, request: pb.RenewLeaseRequest, context) -> pb.Lease:
        lease = await self.leases.renew(request.lease_id, request.ttl_s)
        if lease is not None:
            self.renewed.put_nowait(lease.holder)
        return pb.Lease(lease_id=request.lease_id, granted=lease is not None)

    async def ReleaseLease(self, request: pb.ReleaseLeaseRequest, context) -> pb.ReleaseLeaseResponse:
        await self.leases.release(request.lease_id)
        return pb.ReleaseLeaseResponse()

    async def RegisterReplica(self, request: pb.RegisterReplicaRequest, context) -> pb.RegisterReplicaResponse:
        self.replicas.add(request.replica.replica_id)
        self.registered.put_nowait(request.replica.replica_id)
        return pb.RegisterReplicaResponse(heartbeat_interval_s=0.05)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.HeartbeatResponse:
        if request.leaving:
            self.replicas.discard(request.replica_id)
            return pb.HeartbeatResponse(known=False, routed=self.routed)
        self.beats.put_nowait(request)
        return pb.HeartbeatResponse(known=request.replica_id in self.replicas)


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[FakeCoordinator, str]]:
    fake = FakeCoordinator()
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_a_lease_whose_renewal_is_refused_is_taken_again_before_another_loader_gets_it(coordinator):
    """A restarted coordinator refuses the renewal of a lease it never granted: left at that, the
    node's lease is free and a second replica starts loading beside the one still loading."""
    fake, address = coordinator
    async with node_lease(address, "node-a", "r1", ttl_s=0.6):
        assert await fake.granted.get() == "r1"
        fake.restart()
        assert await asyncio.wait_for(fake.granted.get(), 5) == "r1"  # taken again while r1 still loads
        while fake.renewed.qsize():
            fake.renewed.get_nowait()
        assert await asyncio.wait_for(fake.renewed.get(), 5) == "r1"  # and renewed: r1 holds it
        assert await fake.leases.acquire("node-a", "r2", ttl_s=30, wait_s=0) is None  # r2 waits its turn
    assert await fake.leases.acquire("node-a", "r2", ttl_s=30, wait_s=0) is not None  # released at the end


async def test_heartbeats_go_on_after_a_beat_fails_outside_grpc(coordinator):
    """A load sample that raises (a full disk under the metrics directory, say) must not end the
    heartbeat task: the replica would leave routing while Serve still sees it healthy."""
    fake, address = coordinator
    samples = 0

    def load() -> pb.HeartbeatRequest:
        nonlocal samples
        samples += 1
        if samples == 1:
            raise OSError(28, "No space left on device")
        return pb.HeartbeatRequest(running_requests=3)

    registrar = Registrar(address, REPLICA, load)
    await registrar.start()
    try:
        beat = await asyncio.wait_for(fake.beats.get(), 5)
        assert beat.replica_id == "r1" and beat.running_requests == 3 and samples == 2
    finally:
        await registrar.stop()
    assert "r1" not in fake.replicas  # left routing on stop


async def test_a_replica_registers_again_with_a_restarted_coordinator(coordinator):
    fake, address = coordinator
    registrar = Registrar(address, REPLICA, pb.HeartbeatRequest)
    await registrar.start()
    try:
        assert await fake.registered.get() == "r1"
        fake.restart()
        assert await asyncio.wait_for(fake.registered.get(), 5) == "r1"
        assert "r1" in fake.replicas
    finally:
        await registrar.stop()


async def test_a_leaving_replica_learns_whether_its_version_still_serves(coordinator):
    fake, address = coordinator
    for routed in (True, False):
        fake.routed = routed
        registrar = Registrar(address, REPLICA, pb.HeartbeatRequest)
        await registrar.start()
        assert await registrar.stop() is routed and "r1" not in fake.replicas


async def test_a_replica_leaving_an_unreachable_coordinator_counts_as_routed():
    """No coordinator to ask: the platform is stopping (its own deadline bounds the drain)."""
    registrar = Registrar("127.0.0.1:1", REPLICA, pb.HeartbeatRequest)
    assert await registrar.stop() is True


@pytest.mark.parametrize("routed", [True, False])
async def test_a_stopping_replica_drains_for_streams_unless_its_version_was_retired(routed):
    from services.worker import deployment

    class Stopped:
        grace_s: float | None = None
        servicer = type("Servicer", (), {"inflight": ()})()

        async def stop(self, grace_s: float) -> None:
            self.grace_s = grace_s

    class Leaving:
        async def stop(self) -> bool:
            return routed

    replica = types.SimpleNamespace(registrar=Leaving(), server=Stopped(), _engine_metrics=None)
    await deployment.WorkerDeployment.func_or_class.__del__(replica)  # what Serve calls to stop it
    assert replica.server.grace_s == (deployment.STREAM_DRAIN_S if routed else deployment.RETIRED_DRAIN_S)


def test_a_replicas_whole_stop_fits_in_serves_graceful_shutdown_timeout():
    """Leave routing, drain, stop the engine (SIGTERM, then SIGKILL after its grace): past Serve's
    timeout the replica is killed mid-stop and its engine process is left behind."""
    from services.worker.deployment import RETIRED_DRAIN_S, STREAM_DRAIN_S, WorkerDeployment

    stop_grace_s = inspect.signature(llama_server.LlamaServer.stop).parameters["grace_s"].default
    worst = registration.LEAVE_TIMEOUT_S + max(STREAM_DRAIN_S, RETIRED_DRAIN_S) + stop_grace_s
    assert worst < WorkerDeployment._deployment_config.graceful_shutdown_timeout_s
