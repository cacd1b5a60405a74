"""The edge as a gateway replica runs it, minus Ray, for end-to-end tests over real sockets: the real
app (`create_app`) served by the real `ReusePortServer` (uvicorn in its own uvloop thread), routed by
a `RouteTable` fed hand-built routing snapshots to real `WorkerServicer`s on grpc.aio servers around
an engine double (tests/engine_double.py). Its fixtures are in tests/unit/gateway_fixtures.py (a
plugin: `pytest_plugins = ("tests.unit.gateway_fixtures",)`).

After every test the edge, the picker and the workers must hold no request any more.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common.routes import Endpoint, RouteTable
from services.gateway.app import GatewaySettings, create_app
from services.gateway.edge.http_server import ReusePortServer
from services.gateway.identity import Authenticator
from tests.engine_double import ServedWorker
from tests.platform_process import free_port

MODEL = "m"
SLASHED = "org/big"  # routed, no replica: exercises the `{model_id:path}` route
SCRIPT = ["Hello", " world", "!"]
MAX_BODY = 2048
SERVER_ID = "gw-test-1"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "say hi"}]}


# ---- harness -----------------------------------------------------------------------------------

class Gateway:
    """The edge as a gateway replica runs it, minus Ray: app + ReusePortServer + RouteTable."""

    def __init__(self, *, server_id: str = SERVER_ID, drain_s: float = 0, authenticator: Authenticator | None = None,
                 **settings: Any) -> None:
        self.table = RouteTable()
        config = GatewaySettings(**{"coordinator": f"127.0.0.1:{free_port()}", "max_body_bytes": MAX_BODY, **settings})
        self.app = create_app(self.table, config, authenticator=authenticator or Authenticator())
        self.http = ReusePortServer(self.app, "127.0.0.1", 0, on_stop=self.table.close, drain_s=drain_s, graceful_s=2,
                                    server_id=server_id, **config.http_server_options())
        self.http.start()
        self.url = f"http://127.0.0.1:{self.http.port}"
        self.version = 0

    async def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's event loop (the table's channels live there)."""
        async def call() -> Any:
            return fn()
        assert self.http.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self.http.loop))

    async def route(self, *addresses: str, pending: tuple[str, ...] = (), slashed: bool = True,
                    requests_per_minute: int = 0, tokens_per_minute: int = 0) -> None:
        """Apply a snapshot routing MODEL to `addresses` (and SLASHED to nothing)."""
        self.version += 1
        snapshot = cpb.RoutingSnapshot(version=self.version, pending=list(pending))
        model = snapshot.models.add(name=MODEL, version="v1", max_model_len=64)
        model.rate_limits.requests_per_minute, model.rate_limits.tokens_per_minute = \
            requests_per_minute, tokens_per_minute
        for i, address in enumerate(addresses):
            host, port = address.rsplit(":", 1)
            replica = model.replicas.add(replica_id=f"r{i}", model=MODEL, version="v1")
            replica.endpoint.host, replica.endpoint.port = host, int(port)
        if slashed:
            snapshot.models.add(name=SLASHED, version="v1", max_model_len=64)
        await self.on_loop(lambda: self.table.apply(snapshot))

    def endpoint(self, address: str) -> Endpoint:
        return next(e for e in self.table.routes[MODEL].endpoints if e.address == address)

    async def stop(self) -> None:
        await self.http.drain_and_stop()


async def sse(client: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """POST and read the whole event stream: the response and its `data:` payloads, in order."""
    async with client.stream("POST", path, json=payload) as r:
        lines = [line async for line in r.aiter_lines()]
    events = [line.removeprefix("data: ") for line in lines if line]
    assert all(line.startswith("data: ") for line in lines if line), lines
    return r, events


async def raw_post(port: int, path: str, payload: dict[str, Any]) -> tuple[asyncio.StreamReader,
                                                                          asyncio.StreamWriter]:
    """A POST on a plain socket, so the test decides exactly when the client hangs up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(payload).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    return reader, writer


async def read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    buf = b""
    async with asyncio.timeout(5):
        while marker not in buf:
            data = await reader.read(4096)
            assert data, f"the server closed before {marker!r}: {buf!r}"
            buf += data
    return buf


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def served_by(*workers: ServedWorker) -> list[int]:
    return [len(w.engine.started) for w in workers]
