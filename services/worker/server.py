"""The worker's own `grpc.aio` server: Worker service + standard grpc.health.v1."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2_grpc
from services.common.interceptors import platform_server
from services.common.limits import replica_limits
from services.common.routes import MAX_MESSAGE_BYTES
from services.worker.host import SERVICE_NAME, LoadGate, ModelHost
from services.worker.servicer import WorkerServicer

SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),  # an explicit port must never be shared silently by two workers
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.http2.max_pings_without_data", 0),
    # A caller's delivery stream stays open while no token flows, and its channel pings every 20 s
    # (routes.CHANNEL_OPTIONS): accept that, where gRPC's default (one ping per 5 min without data)
    # counts each as a strike and answers the third with GOAWAY "too many pings", failing every call
    # on the connection. (gRPC ignores unknown keys: tests/unit/test_delivery.py checks this one works.)
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
]


def worker_server(servicer: worker_pb2_grpc.WorkerServicer,
                  health_servicer: health.aio.HealthServicer | None = None) -> grpc.aio.Server:
    """A worker gRPC server (not bound, not started): the one construction the process, the Serve
    replica and the tests share."""
    return platform_server(worker_pb2_grpc.add_WorkerServicer_to_server, servicer, SERVER_OPTIONS, health_servicer)


@dataclass
class WorkerServer:
    server: grpc.aio.Server
    host: ModelHost
    servicer: WorkerServicer
    port: int

    async def stop(self, grace_s: float = 5.0) -> None:
        self.servicer.deliveries.close_when_idle()  # in-flight calls finish; then their delivery streams end
        await self.server.stop(grace_s)
        await self.host.shutdown()


async def start_worker_server(spec: common_pb2.ModelSpec | None, host: str = "127.0.0.1",
                              port: int = 0, gate: LoadGate | None = None) -> WorkerServer:
    """Listen at once (health NOT_SERVING) and, given a spec, start loading it in the background."""
    health_servicer = health.aio.HealthServicer()
    model_host = ModelHost(health_servicer)
    servicer = WorkerServicer(model_host)
    server = worker_server(servicer, health_servicer)
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    if spec is not None:
        model_host.begin_load(spec, gate)
        servicer.gate.apply(replica_limits(spec))
    return WorkerServer(server=server, host=model_host, servicer=servicer, port=bound)
