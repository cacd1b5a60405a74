"""The coordinator's gRPC server: the servicer (and health) behind the shared interceptors."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health

from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.interceptors import platform_server


def coordinator_server(servicer: coordinator_pb2_grpc.CoordinatorServicer, address: str,
                       health_servicer: health.aio.HealthServicer | None = None) -> tuple[grpc.aio.Server, int]:
    """A server (not started yet) for `servicer` bound to `address`, and the port it got
    (`host:0` picks a free one). Raises OSError when the address cannot be bound."""
    # No SO_REUSEPORT: a second coordinator on a taken port must fail, not share it.
    server = platform_server(coordinator_pb2_grpc.add_CoordinatorServicer_to_server, servicer,
                             [("grpc.so_reuseport", 0)], health_servicer)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return server, port
