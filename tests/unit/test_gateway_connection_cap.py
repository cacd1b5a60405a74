"""A gateway replica's cap on open HTTP connections (`MSHIP_MAX_CONNECTIONS`, by default what the
open-file limit leaves): a request on a connection past it is answered with a 503 OpenAI error and
the connection closes, before the app; the replica's own channels and files keep their descriptors.
Against the real `ReusePortServer` on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from services.gateway.app import GatewaySettings
from services.gateway.edge import http_server
from services.gateway.edge.http_server import FD_RESERVE, HttpLimits, ReusePortServer, default_max_connections
from tests.helpers import until
from tests.unit.test_gateway_lifecycle import EchoApp

CAP = 2


def refused_total() -> float:
    return REGISTRY.get_sample_value("mship_gateway_rejections_total", {
        "model": "", "status": "503", "code": "too_many_connections"}) or 0.0


@pytest.fixture
async def capped() -> AsyncIterator[tuple[ReusePortServer, EchoApp]]:
    app = EchoApp()
    server = ReusePortServer(app, "127.0.0.1", 0, drain_s=0, graceful_s=1, limits=HttpLimits(max_connections=CAP))
    server.start()
    yield server, app
    await server.drain_and_stop()


def open_connections(server: ReusePortServer) -> int:
    return len(server.server.server_state.connections)


async def test_a_request_past_the_cap_is_answered_503_and_its_connection_closed(capped):
    server, app = capped
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(CAP)]
    before = refused_total()
    try:
        await until(lambda: open_connections(server) == CAP, "the idle connections accepted")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        async with asyncio.timeout(5):
            answer = await reader.read()  # to the end: the server closes the connection
        writer.close()
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503 "), head
        assert b"retry-after: 1" in head and b"connection: close" in head and b"application/json" in head
        error = json.loads(body)["error"]
        assert (error["type"], error["code"], error["param"]) == ("server_error", "too_many_connections", None)
        assert f"{CAP} open connections" in error["message"]
        assert app.requests == 0 and refused_total() - before == 1
        _, idle_writer = idle.pop()
        idle_writer.close()  # one leaves: the next request is served
        await until(lambda: open_connections(server) < CAP, "the closed connection gone")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as client:
            served = await client.post("/", content=b"abc")
        assert (served.status_code, served.text, app.requests) == (200, "3", 1)
    finally:
        for _, writer in idle:
            writer.close()


async def test_connections_under_the_cap_keep_alive_and_are_served():
    app = EchoApp()
    server = ReusePortServer(app, "127.0.0.1", 0, drain_s=0, graceful_s=1, limits=HttpLimits(max_connections=CAP))
    server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5,
                                     limits=httpx.Limits(max_connections=CAP)) as client:
            answers = await asyncio.gather(*(client.post("/", content=b"x" * n) for n in range(10)))
        assert [a.text for a in answers] == [str(n) for n in range(10)] and app.requests == 10
    finally:
        await server.drain_and_stop()


@pytest.mark.parametrize(("soft", "cap"), [(20_000, 20_000 - FD_RESERVE), (1024, 1024 - FD_RESERVE), (256, 64),
                                           (resource.RLIM_INFINITY, 0)])
def test_the_default_cap_leaves_the_replica_its_descriptors(monkeypatch, soft, cap):
    monkeypatch.setattr(http_server.resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    assert default_max_connections() == cap


def test_the_setting_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MSHIP_MAX_CONNECTIONS", "5")
    assert GatewaySettings().max_connections == 5
    monkeypatch.setenv("MSHIP_MAX_CONNECTIONS", "0")
    assert GatewaySettings().max_connections == 0  # no cap
    monkeypatch.delenv("MSHIP_MAX_CONNECTIONS")
    assert GatewaySettings().max_connections == default_max_connections()
