"""Keep a worker replica in the coordinator's routing table: register, heartbeat, re-register.

A coordinator that restarted answers a heartbeat with known=false; the replica registers again,
which is how the new coordinator rebuilds its table without blanking live routes. Each heartbeat
carries the replica's load and health (an engine that died takes the replica out of routing within
one beat) and brings back its model's current backpressure limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.channels import aio_channel

log = logging.getLogger(__name__)


class Registrar:
    def __init__(self, coordinator: str, replica: pb.ReplicaInfo, load: Callable[[], pb.HeartbeatRequest],
                 on_limits: Callable[[common_pb2.ReplicaLimits], None] = lambda _: None,
                 interval_s: float = 1.0) -> None:
        self.replica = replica
        self._load, self._on_limits = load, on_limits
        self._interval_s = interval_s
        self._channel = aio_channel(coordinator)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Register (retrying until the coordinator answers), then heartbeat in the background."""
        await self._register(wait=True)
        self._task = asyncio.create_task(self._heartbeats())

    async def _register(self, wait: bool) -> None:
        while True:
            try:
                reply = await self._stub.RegisterReplica(pb.RegisterReplicaRequest(replica=self.replica), timeout=5)
                if reply.heartbeat_interval_s > 0:
                    self._interval_s = reply.heartbeat_interval_s
                return
            except grpc.aio.AioRpcError as e:
                if not wait:
                    raise
                log.warning("registering %s: coordinator unavailable (%s); retrying", self.replica.replica_id,
                            e.code().name)
                await asyncio.sleep(self._interval_s)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            beat = self._load()
            beat.replica_id = self.replica.replica_id
            try:
                reply = await self._stub.Heartbeat(beat, timeout=5)
                if not reply.known:
                    await self._register(wait=False)
                elif reply.HasField("limits") and reply.limits != beat.limits:
                    self._on_limits(reply.limits)
            except grpc.aio.AioRpcError as e:  # coordinator restarting: keep serving, keep trying
                log.info("heartbeat of %s failed: %s", self.replica.replica_id, e.code().name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(grpc.aio.AioRpcError):
            # Mark the replica gone at once rather than after missed heartbeats (drain).
            await self._stub.Heartbeat(pb.HeartbeatRequest(replica_id=self.replica.replica_id, leaving=True),
                                       timeout=2)
        await self._channel.close()


LEASE_TTL_S = 30.0


@contextlib.asynccontextmanager
async def node_lease(coordinator: str, node_id: str, holder: str, ttl_s: float = LEASE_TTL_S):
    """Hold the node's load lease for the body: replicas on one node load one at a time. Renewed
    while held; if this process dies, the lease expires after `ttl_s` and the next loader goes."""
    async with aio_channel(coordinator) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        lease = None
        while lease is None:
            try:
                reply = await stub.AcquireLease(pb.AcquireLeaseRequest(
                    node_id=node_id, holder=holder, ttl_s=ttl_s, wait_s=10.0), timeout=20)
                lease = reply if reply.granted else None
            except grpc.aio.AioRpcError as e:  # coordinator restarting: wait for it
                log.info("load lease for %s: %s; retrying", holder, e.code().name)
                await asyncio.sleep(1.0)
        log.info("load lease %s granted to %s on %s", lease.lease_id, holder, node_id)

        async def renew() -> None:
            while True:
                await asyncio.sleep(ttl_s / 3)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.RenewLease(pb.RenewLeaseRequest(lease_id=lease.lease_id, ttl_s=ttl_s), timeout=5)

        renewer = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.lease_id), timeout=5)
