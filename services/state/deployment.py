"""The state service as a Ray Serve deployment serving gRPC on its own port (services/state/server.py)."""

from __future__ import annotations

import logging
import os

from ray import serve

from services.common.logs import configure_logging
from services.common.tracing import configure_tracing
from services.common.vocabulary import ENV_STATE_STORE
from services.state.server import start_state_server

__all__ = ["StateDeployment", "start_state_server"]
log = logging.getLogger(__name__)


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=4, health_check_period_s=2)
class StateDeployment:
    async def __init__(self, host: str, port: int, store_url: str | None = None) -> None:
        configure_logging("state")
        configure_tracing("state")
        url = store_url or os.environ.get(ENV_STATE_STORE, "memory://")
        self.server, self.port = await start_state_server(url, host, port)
        log.info("state service on %s:%d (%s)", host, self.port, url.split("@")[-1])

    async def __del__(self) -> None:
        if hasattr(self, "server"):  # not when __init__ failed (e.g. the port was taken)
            await self.server.stop(2)
