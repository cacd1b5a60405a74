"""The coordinator as a Ray Serve deployment (one replica) serving gRPC on its own port.

If its replica dies, Serve starts a new one; that one rebuilds its replica registry from Serve's
running model apps, the committed set and the workers' re-registrations (`recovery`) before it
answers any WatchRouting, so gateways keep routing with their last snapshot meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from grpc_health.v1 import health, health_pb2
from ray import serve

from services.common.logs import configure_logging
from services.common.tracing import configure_tracing
from services.coordinator.deployer import Deployer
from services.coordinator.leases import LeaseManager
from services.coordinator.recovery import take_over
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.serve_control import RayServeControl
from services.coordinator.server import coordinator_server
from services.coordinator.servicer import CoordinatorServicer
from services.state.client import StateClient

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 3.5  # three missed heartbeats
RECOVERY_WAIT_S = 3 * HEARTBEAT_INTERVAL_S + 2.0  # for the running replicas to re-register


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4, health_check_period_s=2,
                  num_replicas=1)
class CoordinatorDeployment:
    async def __init__(self, host: str, port: int, state_address: str, advertise: str | None = None,
                       expected: list[str] | None = None) -> None:
        configure_logging("coordinator")
        configure_tracing("coordinator")
        self.address = advertise or f"{host}:{port}"  # what workers dial: never a wildcard bind address
        self.expected = list(expected or [])  # what `mship start` was asked to serve
        self.state = StateClient(state_address)
        self.serve = RayServeControl()
        self.registry = ReplicaRegistry(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        self.deployer = Deployer(self.registry, self.serve, self.address, commit=self.state.put_model_set,
                                 committed=self.state.get_model_set)
        self.servicer = CoordinatorServicer(self.registry, self.deployer, LeaseManager(), self.serve,
                                            HEARTBEAT_INTERVAL_S)
        self.health = health.aio.HealthServicer()
        self.server, _ = coordinator_server(self.servicer, f"{host}:{port}", self.health)
        # Before the server starts: recovery holds the deploys back before any can arrive.
        self._tasks = [asyncio.create_task(self._recover()), asyncio.create_task(self._expire_loop())]
        await self.server.start()
        log.info("coordinator on %s", self.address)

    async def _recover(self) -> None:
        """Adopt what is already running (a restart), then open WatchRouting."""
        async def ready() -> None:
            self.servicer.routing_ready.set()
            await self.health.set("", health_pb2.HealthCheckResponse.SERVING)

        await take_over(self.registry, self.deployer, self.serve, lambda: self.state.get_model_set(timeout_s=5),
                        self.expected, RECOVERY_WAIT_S, ready)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S / 2)
            gone = await self.registry.expire()
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
