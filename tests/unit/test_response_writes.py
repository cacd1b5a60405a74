"""Fewer writes per response at the edge: a response's head goes out with its first body bytes
(services/gateway/edge/http_server.py `_HeadWithBody`), and an event stream's `[DONE]` ends its body
in the same write (services/gateway/edge/sse.py). Counted on the real `ReusePortServer`'s transport
over 127.0.0.1, and what the client reads is unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from services.gateway.edge import http_server
from services.gateway.edge.http_server import HttpLimits, ReusePortServer
from services.gateway.edge.sse import SSE_DONE, EventStreamResponse
from tests.unit.test_gateway_lifecycle import EchoApp


class StreamApp:
    """/stream: an event stream of two events and [DONE]; anything else: EchoApp's answer."""

    def __init__(self) -> None:
        self.echo, self.released = EchoApp(), 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["path"] != "/stream":
            return await self.echo(scope, receive, send)

        async def frames() -> AsyncIterator[bytes]:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n" + SSE_DONE

        await EventStreamResponse(frames(), self.release)(scope, receive, send)

    def release(self) -> None:
        self.released += 1


class Recording:
    """A connection's transport that records what is written to it."""

    def __init__(self, transport, writes: list[bytes]) -> None:
        self._transport, self._writes = transport, writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[ReusePortServer, StreamApp, list[bytes]]]:
    writes: list[bytes] = []
    made = http_server._BoundedHttp.connection_made

    def connection_made(self, transport) -> None:  # every write of the server's connections, recorded
        made(self, Recording(transport, writes))

    monkeypatch.setattr(http_server._BoundedHttp, "connection_made", connection_made)
    app = StreamApp()
    server = ReusePortServer(app, "127.0.0.1", 0, drain_s=0, graceful_s=1, limits=HttpLimits())
    server.start()
    yield server, app, writes
    await server.drain_and_stop()


async def test_a_streamed_response_takes_one_write_per_event_head_and_end_included(served):
    server, app, writes = served
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as client:
        async with client.stream("GET", "/stream") as r:
            body = b"".join([chunk async for chunk in r.aiter_bytes()])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert body == b"data: 1\n\ndata: 2\n\n" + SSE_DONE and app.released == 1
    assert len(writes) == 2, writes  # head + first event; last event + [DONE] + the chunked end
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"data: 1\n\n\r\n")
    assert writes[1].endswith(SSE_DONE + b"\r\n0\r\n\r\n")


async def test_plain_answers_head_requests_and_100_continue_are_unchanged(served):
    server, app, writes = served
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as client:
        plain = await client.post("/", content=b"abc")
        head = await client.head("/")
        assert len(writes) == 2  # one write each: the head with the body; a HEAD answer's head alone
    assert (plain.status_code, plain.text, head.status_code) == (200, "3", 200)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(5):
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"  # at once, not held
        writer.write(b"abcd")
        answer = await reader.readuntil(b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ") and await reader.readexactly(1) == b"4"
    writer.close()
    assert app.echo.requests == 3
