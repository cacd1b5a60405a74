"""A real MCP server (the `mcp` SDK's `MCPServer` over streamable HTTP, served by uvicorn) on
127.0.0.1 and a free port, in a background thread: the server end of the gateway's MCP tool loop.

    server = McpTestServer()
    url = server.start()          # http://127.0.0.1:<port>/mcp, the default tools below
    ...                           # server.calls: (tool, arguments, time) of every tools/call seen
    server.stop()

The default tools: `lookup_weather(city)` -> "Sunny, 21 C in <city>", `forecast(city, days)`
(structured content), `slow(seconds)` (reports its cancellation: `cancelled`, `wait_cancelled`),
`broken()` (an isError result), `refuse()` (a JSON-RPC error), `whoami(header)` (echoes a request
header). `start(tools=[...])` serves others instead (plain functions, sync or async; their type
hints are the input schema); `McpTestServer(required_headers={...})` answers 401 without them;
`json_response=True` answers with JSON bodies instead of event streams, `force_gzip=True` (with
it) gzips them whatever the request's Accept-Encoding.
An ASGI wrapper records what reached the server over HTTP (`calls`, `requests`) before the SDK
parses it, so a call is recorded even if the tool itself never runs."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import uvicorn
from mcp import MCPError
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import INVALID_PARAMS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER_TOOL_NAME = "whoami"  # the default tool that answers with a request header


class SeenCall(NamedTuple):
    tool: str
    arguments: dict[str, Any]
    time: float  # time.monotonic() when the POST arrived


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str] = field(hash=False)  # lower-cased names


# ---- the default tools ----------------------------------------------------------------------------
def lookup_weather(city: str) -> str:
    """Look up the current weather in a city."""
    return f"Sunny, 21 C in {city}"


def broken() -> str:
    """A tool that always fails (MCP isError: the model sees the message)."""
    raise ToolError("the weather station is on fire")


def refuse() -> str:
    """A tool whose server answers with a JSON-RPC error instead of a result."""
    raise MCPError(INVALID_PARAMS, "refused: this call is not allowed")


def forecast(city: str, days: int = 3) -> dict[str, Any]:
    """A multi-day forecast, as structured content."""
    return {"city": city, "days": [{"day": d, "sky": "sunny"} for d in range(days)]}


class McpTestServer:
    def __init__(self, host: str = "127.0.0.1", path: str = "/mcp", extra_hosts: Sequence[str] = (),
                 required_headers: Mapping[str, str] | None = None, refused_methods: Iterable[str] = (),
                 json_response: bool = False, force_gzip: bool = False) -> None:
        """`extra_hosts`: Host header values the server accepts besides 127.0.0.1 and localhost
        (the SDK refuses others, as DNS rebinding protection), e.g. "mcp.test:*".
        `required_headers`: a request without them (names case-insensitive) gets HTTP 401.
        `refused_methods`: JSON-RPC methods (e.g. "tools/list") answered with a JSON-RPC error."""
        self.host, self.path, self.extra_hosts = host, path, list(extra_hosts)
        self.refused_methods = frozenset(refused_methods)
        self.json_response, self.force_gzip = json_response, force_gzip
        self.required_headers = {k.lower(): v for k, v in (required_headers or {}).items()}
        self.port = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: list[SeenCall] = []
        self._requests: list[SeenRequest] = []
        self._cancelled: list[str] = []
        self._started_slow = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ---- what the server saw (thread-safe snapshots) -----------------------------------------------
    @property
    def calls(self) -> list[SeenCall]:
        with self._lock:
            return list(self._calls)

    @property
    def requests(self) -> list[SeenRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def cancelled(self) -> list[str]:
        """Tools whose run was cancelled on the server (the client went away mid-call)."""
        with self._lock:
            return list(self._cancelled)

    def wait_cancelled(self, tool: str = "slow", timeout: float = 5.0) -> bool:
        """Wait until the server has seen a run of `tool` cancelled."""
        with self._changed:
            return self._changed.wait_for(lambda: tool in self._cancelled, timeout)

    def wait_slow_started(self, timeout: float = 5.0) -> bool:
        """Wait for a run of the `slow` tool to start (each start is waited for once)."""
        started = self._started_slow.wait(timeout)
        self._started_slow.clear()
        return started

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    # ---- lifecycle ----------------------------------------------------------------------------------
    def default_tools(self) -> list[Callable[..., Any]]:
        return [lookup_weather, broken, refuse, forecast, self._slow_tool(), self._whoami_tool()]

    def start(self, tools: Sequence[Callable[..., Any]] | None = None) -> str:
        """Serve `tools` (default: `default_tools()`) and return the endpoint URL once it accepts."""
        if self._thread is not None:
            raise RuntimeError("the test MCP server is already started")
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        mcp = MCPServer("mship-test", log_level="WARNING")
        root.setLevel(level)  # MCPServer() configures the root logger (basicConfig, rich): undone
        root.handlers[:] = handlers
        for tool in self.default_tools() if tools is None else tools:
            mcp.add_tool(tool)
        security = TransportSecuritySettings(
            allowed_hosts=["127.0.0.1:*", "localhost:*", *self.extra_hosts],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*"])
        app: ASGIApp = _Recorder(mcp.streamable_http_app(streamable_http_path=self.path, host=self.host,
                                                         json_response=self.json_response,
                                                         transport_security=security), self)
        if self.force_gzip:
            app = _ForceGzip(app)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])),
                                        name=f"mcp-test-server-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test MCP server did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self._server = self._thread = None

    def __enter__(self) -> McpTestServer:  # `with McpTestServer() as s: url = s.start(...)`: stopped at the end
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- tools that report to this server -----------------------------------------------------------
    def _slow_tool(self) -> Callable[..., Any]:
        async def slow(seconds: float) -> str:
            """Sleep for a while, then say so."""
            self._started_slow.set()
            try:
                await anyio.sleep(seconds)
            except anyio.get_cancelled_exc_class():
                with self._changed:
                    self._cancelled.append("slow")
                    self._changed.notify_all()
                raise
            return f"slept {seconds} s"

        return slow

    def _whoami_tool(self) -> Callable[..., Any]:
        async def whoami(header: str, ctx: Context) -> str:
            """Echo one HTTP request header as the server received it."""
            return (ctx.headers or {}).get(header.lower(), "<absent>")

        whoami.__name__ = HEADER_TOOL_NAME
        return whoami

    def _record(self, request: SeenRequest, body: bytes) -> None:
        call = _tool_call(body)
        with self._lock:
            self._requests.append(request)
            if call is not None:
                self._calls.append(SeenCall(call[0], call[1], time.monotonic()))


def _tool_call(body: bytes) -> tuple[str, dict[str, Any]] | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params") or {}
    return str(params.get("name")), dict(params.get("arguments") or {})


def _refusal(body: bytes, methods: frozenset[str]) -> bytes | None:
    """A JSON-RPC error answering `body`, if its method is one of `methods`."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") not in methods:
        return None
    error = {"code": -32601, "message": f"Method not found: {message['method']}"}
    return json.dumps({"jsonrpc": "2.0", "id": message.get("id"), "error": error}).encode()


class _Recorder:
    """ASGI wrapper: reads the whole body once, records it, replays it to the app."""

    def __init__(self, app: ASGIApp, owner: McpTestServer) -> None:
        self.app, self.owner = app, owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.owner._record(SeenRequest(scope["method"], scope["path"], headers), body)
        if any(headers.get(k) != v for k, v in self.owner.required_headers.items()):
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        refusal = _refusal(body, self.owner.refused_methods)
        if refusal is not None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": refusal})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then http.disconnect when the client goes

        await self.app(scope, replay, send)


class _ForceGzip:
    """ASGI wrapper: every whole (non-streamed) response body gzipped, asked for or not."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: Message | None = None

        async def squeeze(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] == "http.response.body" and start is not None and not message.get("more_body"):
                body = gzip.compress(message.get("body", b""))
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-encoding", b"gzip"),
                                                 (b"content-length", str(len(body)).encode())]})
                start = None
                await send({"type": "http.response.body", "body": body})
                return
            if start is not None:  # streamed: passed on as it is
                await send(start)
                start = None
            await send(message)

        await self.app(scope, receive, squeeze)


def tools_named(server: McpTestServer, names: Iterable[str]) -> list[Callable[..., Any]]:
    """A subset of the default tools, by name."""
    wanted = set(names)
    return [t for t in server.default_tools() if t.__name__ in wanted]
