"""The gateway's routing watch (`RoutingWatcher`) against a real coordinator servicer over gRPC,
through a TCP proxy: it follows the coordinator's versions, and a watch whose connection fell
silent (a peer lost without a reset) is given up and watched again on a new connection."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common import routes
from services.common.routes import RouteTable, RoutingWatcher
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from tests.grpc_serving import routing_coordinator
from tests.helpers import until
from tests.tcp_proxy import TcpProxy


@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[ReplicaRegistry, int]]:
    async with routing_coordinator() as (registry, _, port):
        yield registry, port


async def test_a_watch_gone_silent_is_watched_again_on_a_new_connection(
        coordinator: tuple[ReplicaRegistry, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "WATCH_SILENCE_S", 0.5)  # five of the coordinator's keepalives here
    registry, port = coordinator
    proxy = await TcpProxy(port).start()
    watcher = RoutingWatcher(f"127.0.0.1:{proxy.port}", RouteTable(), "gw")
    watcher.start()
    try:
        await until(lambda: watcher.table.received.is_set(), "the first snapshot")
        proxy.freeze()  # the connection falls silent, its sockets open: gRPC does not notice
        await registry.set_active("m", ActiveModel("v1", 0, scale_to_zero=True))
        await until(lambda: watcher.table.version == registry.version and "m" in watcher.table.routes,
                    "the change seen through a new connection", timeout_s=10)
        assert proxy.connections == 2
    finally:
        await watcher.stop()
        await proxy.close()
