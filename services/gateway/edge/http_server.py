"""uvicorn inside a Serve replica, on a socket pre-bound with SO_REUSEPORT: on the replica's own
event loop (`start_here`, what the gateway deployment uses), or in its own uvloop thread (`start`).

Every gateway replica on a node listens on the same port and the kernel spreads connections
between them: plain-uvicorn latency, no Serve proxy hop (measured in shared/notes/edge-http-path.md).
Shutdown drains: stop accepting, answer with `Connection: close` for a moment so keep-alive
clients move to another replica, then let in-flight requests and SSE streams finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import resource
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.common.vocabulary import DEFAULT_FORWARDED_ALLOW_IPS
from services.gateway.edge.errors import send_error
from services.gateway.edge.metrics import REJECTIONS
from services.gateway.protocol_common.openai_error import too_many_connections

MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


@dataclass(frozen=True)
class HttpLimits:
    """What uvicorn's httptools protocol leaves unbounded (a connection that never finishes its
    headers, or stops sending its body, held a task and a file descriptor forever; an 8 MB header
    was read whole and answered)."""

    header_timeout_s: float = 20.0  # the request line and headers, from the connection (or the request's first byte)
    body_idle_s: float = 30.0       # between two reads of a request body (while the app reads it)
    max_header_bytes: int = 64 * 1024
    max_connections: int = 0        # open connections past which a request is answered 503 (0: no limit)


FD_RESERVE = 512  # file descriptors the replica keeps for its gRPC channels, files and Ray


def default_max_connections() -> int:
    """What the process's open-file limit leaves for client connections after FD_RESERVE: past
    it, accept() would fail with EMFILE and take the replica's own channels and files down with it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 0 if soft == resource.RLIM_INFINITY else max(64, soft - FD_RESERVE)


def busy_app(limit: int):
    """The ASGI app that answers a request on a connection past the limit: a 503 OpenAI error that
    closes the connection (a client or load balancer retries it elsewhere)."""
    error = too_many_connections(limit)

    async def busy(scope, receive, send) -> None:
        await send_error(send, error, [(b"connection", b"close")])

    return busy


class _BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol within `HttpLimits`: 408 (or a silent close when nothing came)
    past the header timeout, 431 past the header size, a close when a body stalls, 503 for a request
    on a connection past `max_connections` (counted when its headers are in: connections that sent
    nothing are closed by the header timeout). On the response side only its head's write is touched
    (`_HeadWithBody`): nothing here runs per token."""

    def __init__(self, *args, limits: HttpLimits, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._timer: asyncio.TimerHandle | None = None
        self._in_head, self._head_bytes, self._begun = True, 0, 0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        began = self._begun if self._in_head else -1
        super().data_received(data)
        # Bytes of a head that began in an earlier read (all of this read is head): undercounts by
        # at most one read, never counts a body.
        if self._in_head and began == self._begun and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(b"431 Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._begun = True, 0, self._begun + 1
        self._arm(self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        limit = self.limits.max_connections
        if limit and len(self.connections) > limit:
            REJECTIONS.labels("", "503", "too_many_connections").inc()
            self.app = busy_app(limit)  # this connection's app, for its last request: its answer closes it
        earlier = self.cycle
        super().on_headers_complete()
        cycle = self.cycle  # a new one, unless the request upgrades (a websocket) and has none
        if cycle is not earlier and cycle.scope["method"] != "HEAD":  # (uvicorn writes no body for HEAD)
            cycle.transport = _HeadWithBody(cycle)
        if not self.expect_100_continue:  # that client waits for the app to ask for its body
            self._arm(self.limits.body_idle_s)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.limits.body_idle_s)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, delay_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._in_head:
            if self.cycle is not None and not self.cycle.response_complete:
                self._arm(self.limits.header_timeout_s)  # a pipelined head behind a response: that one first
            elif self._begun:  # a head began and did not end
                self._refuse(b"408 Request Timeout")
            else:
                self.transport.close()  # connected and sent nothing (a preconnect, or a slowloris)
        elif self.flow.read_paused:  # the app has not read what came: the client is not the slow one
            self._arm(self.limits.body_idle_s)
        else:
            self.transport.close()  # a stalled body: the app's receive() sees the disconnect

    def _refuse(self, status: bytes) -> None:
        self._disarm()
        self.transport.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.close()


class _HeadWithBody:
    """A response cycle's transport until its head is out: the head (status line and headers) waits
    for the body's first write and goes out with it, one write and one wake-up of the client fewer
    per response. (The gateway starts a response once its first bytes are ready: a stream's once
    its first event came.) Then the cycle writes to the transport itself again."""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, cycle) -> None:
        self._cycle, self._transport, self._head = cycle, cycle.transport, b""

    def write(self, data: bytes) -> None:
        if not self._head and self._cycle.response_started:  # (a `100 Continue` before it goes at once)
            self._head = data
            return
        self._cycle.transport = self._transport
        self._transport.write(self._head + data)

    def close(self) -> None:  # the app failed, or the connection ends, before a body was sent
        self._cycle.transport = self._transport
        if self._head:
            self._transport.write(self._head)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class _Tracker:
    """ASGI middleware: counts in-flight requests, names the serving replica (`x-mship-gateway`),
    and while draining adds `Connection: close` so keep-alive clients reconnect elsewhere."""

    def __init__(self, app, owner: ReusePortServer) -> None:
        self.app, self.owner = app, owner
        self.header = (b"x-mship-gateway", owner.server_id.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        owner = self.owner
        owner.inflight += 1

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                extra = [self.header, (b"connection", b"close")] if owner.draining else [self.header]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        finally:
            owner.inflight -= 1


def migrates_queued_connections() -> bool:
    """Whether Linux hands the connections queued on a closing SO_REUSEPORT socket to another socket
    of its group (`net.ipv4.tcp_migrate_req`). Else it resets them: a gateway replica that crashes or
    drains beside others can fail a few connections it never accepted."""
    try:
        return MIGRATE_REQ.read_text().strip() == "1"
    except OSError:
        return False


def reuseport_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock  # asyncio's create_server() calls listen() on it


class ReusePortServer:
    def __init__(self, app, host: str, port: int, *, on_start: Callable[[], Awaitable[None]] | None = None,
                 on_stop: Callable[[], Awaitable[None]] | None = None, drain_s: float = 2.0,
                 graceful_s: float = 20.0, server_id: str = "", limits: HttpLimits = HttpLimits(),
                 forwarded_allow_ips: str = DEFAULT_FORWARDED_ALLOW_IPS) -> None:
        self.server_id = server_id
        self.inflight = 0
        self.draining = False
        self.drain_s, self.graceful_s = drain_s, graceful_s
        self.sock = reuseport_socket(host, port)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(
            _Tracker(app, self), http=functools.partial(_BoundedHttp, limits=limits), loop="none", lifespan="off",
            access_log=False, log_level="warning", timeout_keep_alive=30, timeout_graceful_shutdown=graceful_s,
            forwarded_allow_ips=forwarded_allow_ips))  # whose X-Forwarded-For is the client (the audit's)
        # SIGTERM/SIGINT are the process's (Serve's, pytest's), not uvicorn's: on the main thread its
        # serve() would take them for the time it serves and exit on one without the drain.
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        self._on_start, self._on_stop = on_start, on_stop
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        """Return once uvicorn listens (a failed bind must fail the replica's constructor)."""
        def run() -> None:
            import uvloop

            self.loop = uvloop.new_event_loop()
            asyncio.set_event_loop(self.loop)
            if self._on_start is not None:
                self.loop.run_until_complete(self._on_start())
            self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
            if self._on_stop is not None:
                self.loop.run_until_complete(self._on_stop())

        self._thread = threading.Thread(target=run, name="gateway-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway's HTTP server failed to start")
            time.sleep(0.01)

    async def start_here(self, timeout_s: float = 30.0) -> None:
        """Serve on the calling (running) loop; return once uvicorn listens.

        In a Serve replica this is the loop Serve's own gRPC server runs on. gRPC's asyncio layer has
        one completion-queue poller per process that wakes every loop that uses gRPC for every event,
        and hands events on between them: with our own loop in a second thread, each token woke both
        loops and crossed threads (GIL hand-offs), which cost TTFT, ITL and CPU."""
        self.loop = asyncio.get_running_loop()
        if self._on_start is not None:
            await self._on_start()
        self._task = self.loop.create_task(self._serve())
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if self._task.done():
                self._task.result()  # the bind/serve error, if any
                raise RuntimeError("the gateway's HTTP server failed to start")
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway's HTTP server failed to start")
            await asyncio.sleep(0.01)

    async def _serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            if self._on_stop is not None:
                await self._on_stop()

    def healthy(self) -> bool:
        if self.server.should_exit:
            return False
        if self._task is not None:
            return not self._task.done()
        return self._thread is not None and self._thread.is_alive()

    def run_coroutine(self, coro) -> object:
        """Run `coro` on the server's loop from another thread; returns its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def drain_and_stop(self) -> None:
        self.draining = True
        if self.loop is None or (self._thread is None and self._task is None):
            return

        def close_listeners() -> None:
            for server in getattr(self.server, "servers", []):
                server.close()

        self.loop.call_soon_threadsafe(close_listeners)
        await asyncio.sleep(self.drain_s)
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=self.graceful_s + 10)
        else:
            assert self._thread is not None
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, self.graceful_s + 10)
