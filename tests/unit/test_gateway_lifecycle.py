"""A gateway replica's lifecycle and its HTTP server's bounds, against the real code: the Serve
deployment's constructor and health check (minus Ray: Serve's replica context is stubbed) over a
real coordinator servicer; the real `ReusePortServer` on 127.0.0.1 for the connection bounds;
`/readyz` in the real app when the coordinator hangs."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace

import grpc
import httpx
import pytest

from services.coordinator.registry import ActiveModel, ReplicaRegistry
from services.gateway.edge.http_server import HttpLimits, ReusePortServer
from tests.grpc_serving import routing_coordinator
from tests.helpers import until
from tests.unit.gateway_harness import Gateway

LIMITS = HttpLimits(header_timeout_s=0.3, body_idle_s=0.3, max_header_bytes=16 * 1024)


class EchoApp:
    """Answers with the size of the body it read; records each request, and a body cut short."""

    def __init__(self) -> None:
        self.requests = 0
        self.disconnected = 0

    async def __call__(self, scope, receive, send) -> None:
        self.requests += 1
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected += 1
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def bounded() -> AsyncIterator[tuple[ReusePortServer, EchoApp]]:
    app = EchoApp()
    server = ReusePortServer(app, "127.0.0.1", 0, drain_s=0, graceful_s=1, limits=LIMITS)
    server.start()
    yield server, app
    await server.drain_and_stop()


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (within 5 s: the bounds are 0.3 s here)."""
    async with asyncio.timeout(5):
        return await reader.read()


async def test_a_connection_that_sends_nothing_is_closed(bounded):
    server, app = bounded
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await _answer(reader) == b""
    writer.close()
    assert app.requests == 0


async def test_headers_that_never_end_are_answered_408_and_closed(bounded):
    server, app = bounded
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")  # a slowloris: the head never ends
    await writer.drain()
    assert (await _answer(reader)).startswith(b"HTTP/1.1 408 ")
    writer.close()
    assert app.requests == 0


async def test_a_body_that_stops_coming_ends_the_request(bounded):
    server, app = bounded
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    await writer.drain()
    assert await _answer(reader) == b""
    writer.close()
    await until(lambda: app.disconnected == 1, "the app to see the client gone")


async def test_a_header_past_the_bound_is_refused_before_the_app(bounded):
    server, app = bounded
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    answer = b""
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        await writer.drain()
        for _ in range(64):  # 4 MiB of one header, in reads of its own
            writer.write(b"a" * 65536)
            await writer.drain()
        answer = await _answer(reader)
    except ConnectionError:
        pass  # refused while it was still sending: the 431 may be lost to the reset
    finally:
        writer.close()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert app.requests == 0


async def test_bodies_and_keep_alive_are_not_bounded_by_the_header_limit(bounded):
    server, app = bounded
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client:
        big = await client.post("/", content=b"y" * (4 * 2**20))  # far past max_header_bytes
        again = await client.get("/", headers={"x-fine": "z" * 8000})
    assert (big.status_code, big.text, again.status_code, app.requests) == (200, str(4 * 2**20), 200, 2)


async def test_readyz_for_the_gateway_does_not_wait_on_a_hung_coordinator():
    """The coordinator's node lost: its port takes connections and never answers. A probe with a
    1 s timeout (Kubernetes' default) must still see this gateway ready on its routes."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        gateway = Gateway(coordinator=f"127.0.0.1:{hung.getsockname()[1]}")
        try:
            await gateway.route()
            async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
                started = time.monotonic()
                r = await client.get("/readyz", params={"scope": "gateway"})
                took = time.monotonic() - started
        finally:
            await gateway.stop()
    assert r.status_code == 200 and r.json()["ready"] is True
    assert took < 0.9, f"/readyz?scope=gateway took {took:.2f}s"  # it waited on the coordinator: >= 1 s


# ---- the Serve deployment, minus Ray ----------------------------------------------------------

@pytest.fixture
async def coordinator() -> AsyncIterator[tuple[ReplicaRegistry, grpc.aio.Server, int]]:
    async with routing_coordinator() as served:
        yield served


@pytest.fixture
def gateway_class(monkeypatch: pytest.MonkeyPatch) -> type:
    from services.gateway import deployment  # imports Ray Serve: only here

    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="gw-life"))
    monkeypatch.setattr(deployment.serve, "get_replica_context", lambda: context)
    for name in ("configure_logging", "configure_tracing", "ignore_sighup", "freeze_startup_heap"):
        monkeypatch.setattr(deployment, name, lambda *a: None)  # process-wide: not in a test process
    serve_class = deployment.GatewayDeployment.func_or_class  # the class Serve constructs

    class Probe(serve_class):
        def __del__(self) -> None:  # the test runs the async teardown (what Serve runs) itself, once
            pass
    return Probe


async def test_a_gateway_whose_routing_watch_ended_fails_its_health_check(coordinator, gateway_class):
    """A watch that broke (the coordinator away) retries: healthy. A watch that ended would leave
    the replica routing on its last snapshot forever while Serve saw it healthy."""
    registry, _, port = coordinator
    gateway = gateway_class.__new__(gateway_class)
    await gateway.__init__("127.0.0.1", 0, f"127.0.0.1:{port}")
    try:
        gateway.http.drain_s = 0
        gateway.check_health()

        def broken(snapshot) -> None:
            raise ValueError("a snapshot this replica cannot apply")
        gateway.table.apply = broken
        await registry.set_active("m", ActiveModel("v1", 0, scale_to_zero=True))
        await until(lambda: gateway.watcher._task.done(), "the watch to end")
        with pytest.raises(RuntimeError, match="routing watch ended"):
            gateway.check_health()
        closed, close = [], gateway.table.close

        async def recorded_close() -> None:
            closed.append(True)
            await close()
        gateway.table.close = recorded_close
    finally:
        await gateway_class.__mro__[1].__del__(gateway)
    # Serve then stops it: the stop runs to its end (the table and its channels closed), the
    # watch's error is not raised again out of the HTTP server's task (an exception nobody retrieves).
    assert gateway.http._task.done() and gateway.http._task.exception() is None
    assert closed == [True]


async def test_a_gateway_stays_healthy_while_the_coordinator_is_away(coordinator, gateway_class):
    _, server, port = coordinator
    gateway = gateway_class.__new__(gateway_class)
    await gateway.__init__("127.0.0.1", 0, f"127.0.0.1:{port}")
    try:
        gateway.http.drain_s = 0
        gateway.watcher.broke.clear()
        await server.stop(0)
        await until(lambda: gateway.watcher.broke.is_set(), "the watch to break")
        gateway.check_health()  # a transient reason: no replacement
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.http.port}", timeout=10) as client:
            r = await client.get("/readyz", params={"scope": "gateway"})
        assert (r.status_code, json.loads(r.content)["ready"]) == (200, True)
    finally:
        await gateway_class.__mro__[1].__del__(gateway)
