"""The coordinator as a Ray Serve deployment (one replica) serving gRPC on its own port.

If its replica dies, Serve starts a new one; that one rebuilds the routing table from Serve's
running model apps, the committed set and the workers' re-registrations before it answers any
WatchRouting, so gateways keep routing with their last snapshot meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from ray import serve

from mship.coordinator.v1 import coordinator_pb2_grpc
from services.coordinator import serve_control
from services.coordinator.deployer import Deployer
from services.coordinator.leases import LeaseManager
from services.coordinator.routing import RoutingTable
from services.coordinator.servicer import CoordinatorServicer
from services.state.client import StateClient

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 3.5  # three missed heartbeats


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4, health_check_period_s=2,
                  num_replicas=1)
class CoordinatorDeployment:
    async def __init__(self, host: str, port: int, state_address: str) -> None:
        self.address = f"{host}:{port}"
        self.state = StateClient(state_address)
        self.table = RoutingTable(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        self.deployer = Deployer(self.table, self.address, commit=self.state.put_model_set,
                                 committed=self.state.get_model_set)
        self.servicer = CoordinatorServicer(self.table, self.deployer, LeaseManager(), HEARTBEAT_INTERVAL_S)
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.server.add_insecure_port(self.address) == 0:
            raise OSError(f"cannot bind {self.address}")
        await self.server.start()
        self._tasks = [asyncio.create_task(self._recover()), asyncio.create_task(self._expire_loop())]
        log.info("coordinator on %s", self.address)

    async def _recover(self) -> None:
        """Adopt what is already running (a restart), then open WatchRouting."""
        apps = await serve_control.model_apps()
        if apps:
            deadline = time.monotonic() + 3 * HEARTBEAT_INTERVAL_S + 2.0
            while len({r.info.version for r in self.table.replicas.values()}) < len(apps):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await self.table.wait_newer(self.table.version, remaining):
                    break  # some app has no live replica: route what re-registered
            try:
                committed = await self.state.get_model_set(timeout_s=5)
            except grpc.aio.AioRpcError:
                committed = []
            await self.deployer.adopt([r.info for r in self.table.replicas.values()], committed)
        self.servicer.routing_ready.set()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S / 2)
            gone = await self.table.expire()
            if gone:
                log.warning("replicas missed their heartbeats: %s", gone)

    async def check_health(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"coordinator task failed: {task.exception()!r}")

    async def __del__(self) -> None:
        # (parts are missing when __init__ failed, e.g. the port was taken)
        for task in getattr(self, "_tasks", []):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if hasattr(self, "server"):
            await self.server.stop(1)
        if hasattr(self, "state"):
            await self.state.close()
