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


LEAVE_TIMEOUT_S = 2.0  # the last heartbeat (leaving) of a replica that stops


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
            try:
                await self._beat()
            except grpc.aio.AioRpcError as e:  # coordinator restarting: keep serving, keep trying
                log.info("heartbeat of %s failed: %s", self.replica.replica_id, e.code().name)
            except Exception:  # a beat that failed here must not end all later ones
                # Anything else (a load sample or a metrics write that raised, limits that did not
                # apply) would end this task silently: the replica would drop out of routing while
                # its process, and Serve's health check, live on.
                log.exception("heartbeat of %s failed", self.replica.replica_id)

    async def _beat(self) -> None:
        beat = self._load()
        beat.replica_id = self.replica.replica_id
        reply = await self._stub.Heartbeat(beat, timeout=5)
        if not reply.known:
            await self._register(wait=False)
        elif reply.HasField("limits") and reply.limits != beat.limits:
            self._on_limits(reply.limits)

    async def stop(self) -> bool:
        """Leave routing; whether the replica's version still took traffic (`HeartbeatResponse.routed`;
        also when the coordinator does not answer: then the platform itself is stopping)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a dead task must not stop the drain
                await self._task
        routed = True
        with contextlib.suppress(grpc.aio.AioRpcError):
            # Mark the replica gone at once rather than after missed heartbeats (drain).
            reply = await self._stub.Heartbeat(pb.HeartbeatRequest(replica_id=self.replica.replica_id, leaving=True),
                                               timeout=LEAVE_TIMEOUT_S)
            routed = reply.routed
        await self._channel.close()
        return routed


LEASE_TTL_S = 30.0


async def _acquire(stub: coordinator_pb2_grpc.CoordinatorStub, node_id: str, holder: str, ttl_s: float) -> pb.Lease:
    """The node's lease for `holder`, waiting for it (and for a coordinator that is restarting)."""
    while True:
        try:
            reply = await stub.AcquireLease(pb.AcquireLeaseRequest(
                node_id=node_id, holder=holder, ttl_s=ttl_s, wait_s=10.0), timeout=20)
            if reply.granted:
                return reply
        except grpc.aio.AioRpcError as e:  # coordinator restarting: wait for it
            log.info("load lease for %s: %s; retrying", holder, e.code().name)
            await asyncio.sleep(1.0)


@contextlib.asynccontextmanager
async def node_lease(coordinator: str, node_id: str, holder: str, ttl_s: float = LEASE_TTL_S):
    """Hold the node's load lease for the body: replicas on one node load one at a time. Renewed
    while held; if this process dies, the lease expires after `ttl_s` and the next loader goes.
    A renewal the coordinator refuses (it restarted and forgot the lease, or the lease expired
    while the coordinator was unreachable) means the node's lease is free for another loader
    while this one still loads: it is taken again at once (re-entrant for the same holder)."""
    async with aio_channel(coordinator) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        lease = await _acquire(stub, node_id, holder, ttl_s)
        log.info("load lease %s granted to %s on %s", lease.lease_id, holder, node_id)

        async def renew() -> None:
            nonlocal lease
            while True:
                await asyncio.sleep(ttl_s / 3)
                try:
                    reply = await stub.RenewLease(pb.RenewLeaseRequest(lease_id=lease.lease_id, ttl_s=ttl_s),
                                                  timeout=5)
                except grpc.aio.AioRpcError as e:  # unreachable: the next renewal (within the TTL) may do
                    log.info("renewing load lease %s: %s", lease.lease_id, e.code().name)
                    continue
                if not reply.granted:
                    log.warning("load lease %s of %s on %s was refused renewal (lost); taking it again",
                                lease.lease_id, holder, node_id)
                    lease = await _acquire(stub, node_id, holder, ttl_s)
                    log.info("load lease %s granted again to %s on %s", lease.lease_id, holder, node_id)

        renewer = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.ReleaseLease(pb.ReleaseLeaseRequest(lease_id=lease.lease_id), timeout=5)
