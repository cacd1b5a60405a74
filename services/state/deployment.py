"""The state service as a Ray Serve deployment serving gRPC on its own port."""

from __future__ import annotations

import logging
import os

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from ray import serve

from mship.state.v1 import state_pb2_grpc
from services.state.servicer import StateServicer
from services.state.store import open_store

log = logging.getLogger(__name__)


async def start_state_server(store_url: str, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    state_pb2_grpc.add_StateServicer_to_server(StateServicer(open_store(store_url)), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4, health_check_period_s=2)
class StateDeployment:
    async def __init__(self, host: str, port: int, store_url: str | None = None) -> None:
        url = store_url or os.environ.get("MSHIP_STATE_STORE", "memory://")
        self.server, self.port = await start_state_server(url, host, port)
        log.info("state service on %s:%d (%s)", host, self.port, url.split("@")[-1])

    async def __del__(self) -> None:
        await self.server.stop(2)
