"""The state service's own `grpc.aio` server: State service + grpc.health.v1, and the lease sweep."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2

from mship.state.v1 import state_pb2_grpc
from services.common.errors import ServiceError
from services.common.interceptors import platform_server
from services.state.backends import open_store
from services.state.metrics import StateMetricsInterceptor
from services.state.servicer import StateServicer
from services.state.store import Store

log = logging.getLogger(__name__)
# A snapshot holds a whole conversation: allow more than gRPC's 4 MB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
SERVER_OPTIONS = [("grpc.so_reuseport", 0), *GRPC_OPTIONS]
SWEEP_INTERVAL_S = 5.0


def state_server(servicer: state_pb2_grpc.StateServicer,
                 health_servicer: health.aio.HealthServicer | None = None, backend: str = "") -> grpc.aio.Server:
    """A state gRPC server (not bound, not started): the one construction the deployment and the
    tests share."""
    return platform_server(state_pb2_grpc.add_StateServicer_to_server, servicer, SERVER_OPTIONS, health_servicer,
                           outer=[StateMetricsInterceptor(backend)])


async def serve_store(store: Store, host: str, port: int, *,
                      sweep_interval_s: float | None = SWEEP_INTERVAL_S) -> tuple[grpc.aio.Server, int]:
    """Serve `mship.state.v1.State` (+ health) over `store` on host:port (0 = a free port). Until
    the server stops, runs whose owner's lease passed are swept to FAILED every sweep_interval_s
    (None: only on read and on ExpireRuns); when it stops, the store is closed."""
    health_servicer = health.aio.HealthServicer()
    server = state_server(StateServicer(store), health_servicer, store.backend)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    # Held on the server so the task is not garbage-collected; it ends (and closes the store)
    # when the server stops.
    server.mship_housekeeping = asyncio.create_task(_housekeeping(server, store, sweep_interval_s))
    return server, bound


async def start_state_server(store_url: str, host: str, port: int, *,
                             sweep_interval_s: float | None = SWEEP_INTERVAL_S) -> tuple[grpc.aio.Server, int]:
    """`serve_store` over the store `store_url` names (memory:// or redis://...)."""
    return await serve_store(open_store(store_url), host, port, sweep_interval_s=sweep_interval_s)


async def _housekeeping(server: grpc.aio.Server, store: Store, interval_s: float | None) -> None:
    try:
        # wait_for_termination returns True on timeout, i.e. while the server still runs.
        while await server.wait_for_termination(interval_s):
            try:
                failed = await store.expire_runs()
            except ServiceError as e:
                log.warning("sweep of expired runs failed: %s", e.message)
                continue
            except Exception:  # e.g. a malformed lease index entry: the next sweep must still run
                log.exception("sweep of expired runs failed")
                continue
            for record in failed:
                log.warning("run %s failed: its owner %s lost its lease", record.key.response_id, record.owner)
    finally:
        try:
            await store.close()
        except Exception as e:  # the backend may be gone already (e.g. Redis stopped first)
            log.info("closing the store: %r", e)
