"""The state service as a Ray Serve deployment serving gRPC on its own port."""

from __future__ import annotations

import asyncio
import logging
import os

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from ray import serve

from mship.state.v1 import state_pb2_grpc
from services.common.errors import ServiceError
from services.state.servicer import StateServicer
from services.state.store import Store, open_store

log = logging.getLogger(__name__)
# A snapshot holds a whole conversation: allow more than gRPC's 4 MB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
SWEEP_INTERVAL_S = 5.0


async def start_state_server(store_url: str, host: str, port: int, *,
                             sweep_interval_s: float | None = SWEEP_INTERVAL_S) -> tuple[grpc.aio.Server, int]:
    """Serve `mship.state.v1.State` (+ health) on host:port (0 = a free port). Until the server
    stops, runs whose owner's lease passed are swept to FAILED every sweep_interval_s (None: only
    on read and on ExpireRuns)."""
    store = open_store(store_url)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *GRPC_OPTIONS])
    state_pb2_grpc.add_StateServicer_to_server(StateServicer(store), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    # Held on the server so the task is not garbage-collected; it ends (and closes the store)
    # when the server stops.
    server.mship_housekeeping = asyncio.create_task(_housekeeping(server, store, sweep_interval_s))
    return server, bound


async def _housekeeping(server: grpc.aio.Server, store: Store, interval_s: float | None) -> None:
    try:
        # wait_for_termination returns True on timeout, i.e. while the server still runs.
        while await server.wait_for_termination(interval_s):
            try:
                failed = await store.expire_runs()
            except ServiceError as e:
                log.warning("sweep of expired runs failed: %s", e.message)
                continue
            for record in failed:
                log.warning("run %s failed: its owner %s lost its lease", record.key.response_id, record.owner)
    finally:
        try:
            await store.close()
        except Exception as e:  # the backend may be gone already (e.g. Redis stopped first)
            log.info("closing the store: %r", e)


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4, health_check_period_s=2)
class StateDeployment:
    async def __init__(self, host: str, port: int, store_url: str | None = None) -> None:
        url = store_url or os.environ.get("MSHIP_STATE_STORE", "memory://")
        self.server, self.port = await start_state_server(url, host, port)
        log.info("state service on %s:%d (%s)", host, self.port, url.split("@")[-1])

    async def __del__(self) -> None:
        if hasattr(self, "server"):  # not when __init__ failed (e.g. the port was taken)
            await self.server.stop(2)
