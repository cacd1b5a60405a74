"""The gateway as a Ray Serve deployment: each replica serves HTTP itself on a shared
SO_REUSEPORT port (no Serve proxy hop) and watches the coordinator's routing table."""

from __future__ import annotations

import asyncio
import logging
import os

from ray import serve

from services.common.gc_heap import freeze_startup_heap
from services.common.logs import configure_logging
from services.common.picker import PREFIX_AFFINITY, make_picker
from services.common.routes import RouteTable, RoutingWatcher
from services.common.sighup import ignore_sighup
from services.common.tracing import configure_tracing
from services.common.vocabulary import ENV_REPLICA_PICKER, stream_drain_s
from services.gateway.app import GatewaySettings, create_app
from services.gateway.edge.http_server import ReusePortServer
from services.gateway.responses.compaction import CompactionCodec
from services.gateway.responses.router import enable_responses
from services.gateway.responses.serving import ResponsesServing
from services.state.client import StateClient

log = logging.getLogger(__name__)
ROUTES_TIMEOUT_S = 60.0
LISTENERS_DRAIN_S = 2.0  # listeners closed; connections the kernel queued are still served
STREAM_DRAIN_S = stream_drain_s()  # its streams' time once the listeners closed
# Serve kills a replica this long after it asked it to stop: the drain, the streams' time
# (STREAM_DRAIN_S), then the routing watch and state channel closing.
GRACEFUL_SHUTDOWN_S = LISTENERS_DRAIN_S + STREAM_DRAIN_S + 10.0


@serve.deployment(
    # With the launcher's RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0 this __init__, and so the HTTP
    # server (ReusePortServer.start_here), runs on the replica's main loop.
    ray_actor_options={"num_cpus": 0.1},
    max_surge_percent=100,  # the replacement listens before the old replica stops: no refused connections
    graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
    graceful_shutdown_wait_loop_s=0.5,
    health_check_period_s=2,
    max_ongoing_requests=4,
)
class GatewayDeployment:
    async def __init__(self, host: str, port: int, coordinator: str, state_address: str | None = None,
                       max_body_bytes: int | None = None, rate_store: str = "memory://") -> None:
        configure_logging("gateway")
        configure_tracing("gateway")
        ignore_sighup()  # files re-read on change; a SIGHUP after editing one must not end the replica
        settings = GatewaySettings(coordinator=coordinator, rate_store=rate_store)
        if max_body_bytes:
            settings.max_body_bytes = max_body_bytes
        self.table = RouteTable(make_picker(os.environ.get(ENV_REPLICA_PICKER, PREFIX_AFFINITY)))
        replica_id = serve.get_replica_context().replica_id.unique_id
        self.watcher = RoutingWatcher(coordinator, self.table, replica_id)
        app = create_app(self.table, settings)
        self.state: StateClient | None = None
        self.responses: ResponsesServing | None = None

        async def on_start() -> None:  # on the HTTP server's loop (this one): gRPC channels belong to it
            self.watcher.start()
            # A new replica (a scale-up, a replacement) takes traffic only once it holds the current
            # routes: before that it would answer 404/503 for models the others serve.
            try:
                await asyncio.wait_for(self.table.received.wait(), ROUTES_TIMEOUT_S)
            except TimeoutError:
                await self.watcher.stop()
                raise RuntimeError(f"no routing snapshot from the coordinator {coordinator} within "
                                   f"{ROUTES_TIMEOUT_S:.0f}s: {self.watcher.last_error}") from None
            if state_address:
                self.state = StateClient(state_address)
                self.responses = ResponsesServing(self.table, self.state, replica_id, CompactionCodec(),
                                                  app.state.admission)
                enable_responses(app, self.responses)
            freeze_startup_heap("gateway")  # before it serves: no long GC pause mid-stream

        async def on_stop() -> None:
            if app.state.audit is not None:  # its last records: the streams have ended
                await asyncio.to_thread(app.state.audit.close)
            if self.responses is not None:
                await self.responses.stop()
            if self.state is not None:
                await self.state.close()
            await self.watcher.stop()

        self.http = ReusePortServer(app, host, port, on_start=on_start, on_stop=on_stop, server_id=replica_id,
                                    drain_s=LISTENERS_DRAIN_S, graceful_s=STREAM_DRAIN_S,
                                    **settings.http_server_options())
        await self.http.start_here()
        log.info("gateway on %s:%d (coordinator %s)", host, port, coordinator)

    def check_health(self) -> None:
        """Fails (Serve replaces the replica) when its HTTP server stopped or its routing watch ended:
        with the watch gone it would route on its last snapshot forever. A watch that is only broken
        (the coordinator restarting, unreachable) retries on its own and is no reason to fail."""
        if not self.http.healthy():
            raise RuntimeError("the gateway's HTTP server is not running")
        if (why := self.watcher.ended()) is not None:
            raise RuntimeError(f"the gateway's routing watch ended: {why}")

    def record_autoscaling_stats(self) -> dict[str, float]:
        return {"inflight": float(self.http.inflight)}

    def routing_version(self) -> int:
        return self.table.version

    async def __del__(self) -> None:
        if hasattr(self, "http"):  # (missing when __init__ failed before it, e.g. no replica context)
            await self.http.drain_and_stop()
