"""Keep a worker replica in the coordinator's routing table: register, heartbeat, re-register.

A coordinator that restarted answers a heartbeat with known=false; the replica registers again,
which is how the new coordinator rebuilds its table without blanking live routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc

log = logging.getLogger(__name__)


class Registrar:
    def __init__(self, coordinator: str, replica: pb.ReplicaInfo, inflight: Callable[[], int],
                 interval_s: float = 1.0) -> None:
        self.replica = replica
        self._inflight = inflight
        self._interval_s = interval_s
        self._channel = grpc.aio.insecure_channel(coordinator)
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
                reply = await self._stub.Heartbeat(pb.HeartbeatRequest(
                    replica_id=self.replica.replica_id, inflight_calls=self._inflight()), timeout=5)
                if not reply.known:
                    await self._register(wait=False)
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
