"""`services.gateway.mcp.client` against a real MCP server (`tests/mcp_server.py`: the SDK's
MCPServer over streamable HTTP on 127.0.0.1): listing, calling, headers, failures, cancellation."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from services.common.vocabulary import ENV_MCP_ALLOWED_HOSTS, ENV_MCP_TIMEOUT_S
from services.gateway.mcp.client import (
    DEFAULT_TIMEOUT_S,
    MAX_ANSWER_BYTES,
    MAX_TOOLS,
    McpClient,
    McpToolError,
    McpUnavailable,
    ToolResult,
    timeout_from_env,
)
from services.gateway.mcp.egress import EgressPolicy, EgressRefused
from services.gateway.mcp.tools import McpServerSpec, parse_mcp_tool
from tests.mcp_server import HEADER_TOOL_NAME, McpTestServer
from tests.platform_process import free_port

SECRET = "s3cr3t-header-value"
LOCAL = EgressPolicy.parse("127.0.0.1,localhost")


@pytest.fixture(scope="module")
def server() -> Iterator[McpTestServer]:
    with McpTestServer() as s:
        s.start()
        yield s


def spec_for(url: str, **kw: Any) -> McpServerSpec:
    return parse_mcp_tool({"type": "mcp", "server_label": "weather", "server_url": url, **kw})


def client(url: str, timeout_s: float = 10, **kw: Any) -> McpClient:
    return McpClient(spec_for(url, **kw), timeout_s=timeout_s, policy=LOCAL)


async def test_list_tools(server: McpTestServer) -> None:
    tools = {t.name: t for t in await client(server.url).list_tools()}
    assert {"lookup_weather", "slow", "broken", "forecast", HEADER_TOOL_NAME} <= set(tools)
    weather = tools["lookup_weather"]
    assert weather.description == "Look up the current weather in a city."
    assert weather.input_schema["properties"]["city"]["type"] == "string"
    assert weather.input_schema["required"] == ["city"]
    assert weather.as_dict()["name"] == "lookup_weather"


async def test_allowed_tools_filter(server: McpTestServer) -> None:
    tools = await client(server.url, allowed_tools=["lookup_weather", "not_there"]).list_tools()
    assert [t.name for t in tools] == ["lookup_weather"]
    with pytest.raises(McpToolError, match="not in its allowed_tools"):
        await client(server.url, allowed_tools=["lookup_weather"]).call_tool("broken", {})


async def test_call_tool(server: McpTestServer) -> None:
    result = await client(server.url).call_tool("lookup_weather", {"city": "Oslo"})
    assert result == ToolResult("Sunny, 21 C in Oslo", False, {"result": "Sunny, 21 C in Oslo"})
    assert ("lookup_weather", {"city": "Oslo"}) in [(c.tool, c.arguments) for c in server.calls]


async def test_structured_result_is_json_text(server: McpTestServer) -> None:
    result = await client(server.url).call_tool("forecast", {"city": "Rome", "days": 1})
    assert not result.is_error and result.structured == {"city": "Rome", "days": [{"day": 0, "sky": "sunny"}]}
    assert '"city": "Rome"' in result.text


async def test_tool_error_is_a_result_with_is_error(server: McpTestServer) -> None:
    result = await client(server.url).call_tool("broken", {})
    assert result.is_error and "the weather station is on fire" in result.text
    with pytest.raises(McpToolError):
        result.raise_for_error()
    unknown = await client(server.url).call_tool("no_such_tool", {})  # MCPServer answers isError, not an MCP error
    assert unknown.is_error and "no_such_tool" in unknown.text


async def test_mcp_error_is_a_tool_error(server: McpTestServer) -> None:
    with pytest.raises(McpToolError, match="MCP server 'weather' refused to call 'refuse': refused: this call is"):
        await client(server.url).call_tool("refuse", {})


async def test_headers_are_sent_and_never_logged(server: McpTestServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"{server.url}?key=query-secret"
    c = client(url, headers={"X-Api-Key": SECRET}, authorization="tok-secret")
    assert (await c.call_tool(HEADER_TOOL_NAME, {"header": "x-api-key"})).text == SECRET
    assert (await c.call_tool(HEADER_TOOL_NAME, {"header": "authorization"})).text == "Bearer tok-secret"
    assert all(r.headers.get("x-api-key") == SECRET for r in server.requests[-2:])
    await c.list_tools()
    with pytest.raises(McpUnavailable) as info:
        await client(url.replace("/mcp", "/nope"), headers={"X-Api-Key": SECRET}).list_tools()
    text = caplog.text + str(info.value) + repr(c)
    assert "weather" in caplog.text
    for secret in (SECRET, "tok-secret", "query-secret"):
        assert secret not in text


async def test_http_errors_are_unavailable() -> None:
    with McpTestServer(required_headers={"X-Api-Key": SECRET}) as guarded:
        guarded.start()
        with pytest.raises(McpUnavailable, match="HTTP 401 Unauthorized"):
            await client(guarded.url).list_tools()
        with pytest.raises(McpUnavailable, match="HTTP 401"):
            await client(guarded.url, headers={"X-Api-Key": "wrong"}).call_tool("lookup_weather", {"city": "x"})
        ok = await client(guarded.url, headers={"x-api-key": SECRET}).call_tool("lookup_weather", {"city": "Bern"})
        assert ok.text == "Sunny, 21 C in Bern"


async def test_unresolvable_host_is_unavailable() -> None:
    async def no_dns(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    c = McpClient(spec_for("http://gone.test/mcp"), policy=EgressPolicy.parse("gone.test", resolver=no_dns))
    with pytest.raises(McpUnavailable, match="does not resolve"):
        await c.list_tools()


async def test_unreachable_port_is_unavailable_quickly() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(McpUnavailable, match=rf"MCP server 'weather' at 127.0.0.1:{port} is unreachable"):
        await client(f"http://127.0.0.1:{port}/mcp").list_tools()
    assert time.monotonic() - started < 2


async def test_not_an_mcp_endpoint(server: McpTestServer) -> None:
    with pytest.raises(McpUnavailable, match="HTTP 404"):
        await client(server.url.replace("/mcp", "/elsewhere")).list_tools()


async def test_timeout_is_unavailable(server: McpTestServer) -> None:
    started = time.monotonic()
    with pytest.raises(McpUnavailable, match=r"no answer within 0.5 s"):
        await client(server.url, timeout_s=0.5).call_tool("slow", {"seconds": 5})
    assert time.monotonic() - started < 2


async def test_silent_server_times_out() -> None:
    """A server that accepts and never answers: the deadline covers connecting and the handshake."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        started = time.monotonic()
        with pytest.raises(McpUnavailable, match="no answer within"):
            await client(f"http://127.0.0.1:{listener.getsockname()[1]}/mcp", timeout_s=0.5).list_tools()
        assert time.monotonic() - started < 2


async def test_egress_refusal_comes_before_any_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
        refusing = McpClient(spec_for(url), policy=EgressPolicy.parse("127.0.0.1:1"))
        with pytest.raises(EgressRefused, match=ENV_MCP_ALLOWED_HOSTS):
            await refusing.list_tools()
        monkeypatch.delenv(ENV_MCP_ALLOWED_HOSTS, raising=False)  # the default: the environment's, empty
        with pytest.raises(EgressRefused, match="is empty"):
            await McpClient(spec_for(url)).call_tool("lookup_weather", {"city": "x"})
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected


async def test_env_allows_and_times(monkeypatch: pytest.MonkeyPatch, server: McpTestServer) -> None:
    monkeypatch.setenv(ENV_MCP_ALLOWED_HOSTS, "localhost")
    monkeypatch.setenv(ENV_MCP_TIMEOUT_S, "7.5")
    c = McpClient(spec_for(server.url.replace("127.0.0.1", "localhost")))
    assert c.timeout_s == 7.5
    assert (await c.call_tool("lookup_weather", {"city": "Lima"})).text == "Sunny, 21 C in Lima"
    assert timeout_from_env({}) == DEFAULT_TIMEOUT_S
    assert timeout_from_env({ENV_MCP_TIMEOUT_S: "-1"}) == DEFAULT_TIMEOUT_S
    assert timeout_from_env({ENV_MCP_TIMEOUT_S: "soon"}) == DEFAULT_TIMEOUT_S


async def test_cancelling_a_call_closes_it_promptly(server: McpTestServer) -> None:
    before = asyncio.all_tasks()
    task = asyncio.create_task(client(server.url, timeout_s=30).call_tool("slow", {"seconds": 30}))
    assert await asyncio.to_thread(server.wait_slow_started, 10)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert time.monotonic() - started < 1
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert {t for t in asyncio.all_tasks() - before if not t.done()} == set()  # nothing left behind
    assert await asyncio.to_thread(server.wait_cancelled, "slow", 5)  # the server saw its request go away


async def test_a_cancelled_call_stays_cancelled_when_its_session_breaks_while_closing(monkeypatch) -> None:
    """Seen once in a full run: cancelled mid-call, the MCP session's teardown raised
    BrokenResourceError. Mapped like any failure, the cancellation became McpUnavailable and the
    caller's task went on as if the server were down. The session here breaks that way every time."""
    started = asyncio.Event()

    @asynccontextmanager
    async def breaking_on_close(self: McpClient, statuses: list[int]) -> AsyncIterator[object]:
        try:
            yield object()
        finally:
            raise anyio.BrokenResourceError()

    async def slow(_: object) -> None:
        started.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(McpClient, "_connect", breaking_on_close)
    task = asyncio.create_task(client("http://127.0.0.1:9/mcp")._run("call 'slow'", slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_server_that_refuses_to_list_is_a_tool_error_naming_it() -> None:
    """HTTP 200 with a JSON-RPC error to tools/list: the server is up, it refused (the loop fails
    the response with this message, never a 5xx)."""
    with McpTestServer(refused_methods={"tools/list"}) as refusing:
        refusing.start()
        with pytest.raises(McpToolError, match="MCP server 'weather' refused to list tools: Method not found"):
            await client(refusing.url).list_tools()


# ---- a server that answers too much: a clean McpUnavailable, read no further --------------------


def huge(n: int) -> str:
    """A result of n bytes (compresses to almost nothing)."""
    return "x" * n


@pytest.mark.parametrize("json_response", [False, True], ids=["event-stream", "json"])
async def test_an_answer_past_the_byte_budget_is_unavailable(json_response: bool) -> None:
    """Unbounded before: a tool result of any size was read into memory, then stored and shown."""
    with McpTestServer(json_response=json_response) as s:
        s.start(tools=[huge])
        assert (await client(s.url).call_tool("huge", {"n": 1000})).text == "x" * 1000
        with pytest.raises(McpUnavailable, match=f"its answer is larger than {MAX_ANSWER_BYTES} bytes"):
            await client(s.url).call_tool("huge", {"n": 2 * MAX_ANSWER_BYTES})


async def test_a_compressed_answer_is_refused_not_inflated() -> None:
    """Compressed, a result past the budget crossed the wire in a few KiB (a gzip bomb). Answers
    are asked for uncompressed, and one that is compressed anyway is refused."""
    with McpTestServer(json_response=True, force_gzip=True) as s:
        s.start(tools=[huge])
        with pytest.raises(McpUnavailable, match="Content-Encoding 'gzip'"):
            await client(s.url).call_tool("huge", {"n": 2 * MAX_ANSWER_BYTES})
    with McpTestServer() as s:
        s.start(tools=[huge])
        await client(s.url).call_tool("huge", {"n": 1})
        assert s.requests[-1].headers.get("accept-encoding") == "identity"


def many_tools(n: int) -> list[Any]:
    def tool(i: int) -> Any:
        def t() -> str:
            return str(i)
        t.__name__, t.__doc__ = f"t{i}", "A tool."
        return t
    return [tool(i) for i in range(n)]


async def test_a_server_listing_too_many_tools_is_unavailable() -> None:
    with McpTestServer() as s:
        s.start(tools=many_tools(MAX_TOOLS + 1))
        with pytest.raises(McpUnavailable, match=f"lists more than {MAX_TOOLS} tools"):
            await client(s.url).list_tools()
