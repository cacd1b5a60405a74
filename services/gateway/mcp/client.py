"""A client for one remote MCP server (streamable HTTP, the `mcp` SDK): list its tools, call one.

Every operation has a deadline (`MSHIP_MCP_TIMEOUT_S`, default 30 s, connecting included) and a
byte budget (`MAX_ANSWER_BYTES`: everything the server sends it, uncompressed: an MCP server must
answer without a Content-Encoding), lists at most `MAX_TOOLS` tools, is checked by the egress
policy before any connection and connects through `pinned_transport` (see `egress`). The spec's
headers go out as HTTP headers and never into a log line: lines name the server_label and the
URL's host:port only. Failures are `McpUnavailable` (cannot connect, no
answer in time, HTTP errors, not an MCP server), `McpToolError` (the server refused the call: an
unknown tool, bad arguments) or `EgressRefused`; a tool that ran and failed is a `ToolResult`
with `is_error` (MCP's isError), which the model is shown.

Each operation opens its own MCP session and closes it (no connection outlives a call, so none
is left behind by a response that ends). Cancelling an operation closes its HTTP connections at
once; the server sees its request go away."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError

from services.common.vocabulary import ENV_MCP_TIMEOUT_S
from services.gateway.mcp.egress import EgressPolicy, EgressRefused, check_url, pinned_transport, url_host_port
from services.gateway.mcp.tools import ListedTool, McpServerSpec

__all__ = ["ListedTool", "McpClient", "McpToolError", "McpUnavailable", "ToolResult"]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
MAX_LIST_PAGES = 50  # a server whose cursor never ends still answers
MAX_TOOLS = 1000  # per server: each is offered to the model in every generation
MAX_ANSWER_BYTES = 8 * 2**20  # all the HTTP bodies of one operation (a list, every page; a call)
CLIENT_INFO = mcp_types.Implementation(name="mship-gateway", version="0.1.0")
# The SDK's transport errors for a lost connection / a reply that never came, not the server's word.
_TRANSPORT_CODES = (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT)

# httpx2 logs every request's full URL at INFO and the SDK logs it (and session ids) at DEBUG/INFO;
# an MCP URL may carry a key in its query. Quieted unless an operator set their levels.
for _name in ("httpx2", "httpcore2", "mcp.client.streamable_http"):
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.WARNING)


class McpUnavailable(Exception):
    """The server could not be used: unreachable, too slow, an HTTP error, not an MCP server."""


class McpToolError(Exception):
    """The server refused the call (an MCP error: unknown tool, invalid arguments...)."""


@dataclass(frozen=True)
class ToolResult:
    text: str  # the content blocks as text; structured content as JSON when there is no text
    is_error: bool = False  # the tool ran and failed (MCP isError): `text` says why
    structured: Any = None

    def raise_for_error(self) -> ToolResult:
        if self.is_error:
            raise McpToolError(self.text)
        return self


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if environ is None else environ).get(ENV_MCP_TIMEOUT_S, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        log.warning("%s=%r is not a positive number of seconds; using %g", ENV_MCP_TIMEOUT_S, raw, DEFAULT_TIMEOUT_S)
        return DEFAULT_TIMEOUT_S
    return value


class McpClient:
    def __init__(self, spec: McpServerSpec, *, timeout_s: float | None = None,
                 policy: EgressPolicy | None = None) -> None:
        self.spec = spec
        self.timeout_s = timeout_from_env() if timeout_s is None else timeout_s
        self.policy = policy or EgressPolicy.from_env()
        try:
            host, port = url_host_port(spec.server_url)
            self.where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        except EgressRefused:
            self.where = "an invalid URL"

    def __repr__(self) -> str:  # never the URL's path or query, never the headers
        return f"McpClient({self.spec.server_label!r} at {self.where})"

    # ---- the operations -------------------------------------------------------------------------------

    async def list_tools(self) -> list[ListedTool]:
        """The server's tools that the spec's `allowed_tools` allows (every page of them). Listed
        once per response chain: a continuation reads them from its `mcp_list_tools` item."""

        async def page_through(client: Client) -> list[mcp_types.Tool]:
            tools: list[mcp_types.Tool] = []
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor or len(tools) > MAX_TOOLS:
                    break
            return tools

        started = time.monotonic()
        listed = [_listed(t) for t in await self._run("list tools", page_through)]
        if len(listed) > MAX_TOOLS:
            raise self._unavailable("list tools", f"it lists more than {MAX_TOOLS} tools")
        tools = [t for t in listed if self.spec.allows(t.name, t.read_only_hint)]
        log.debug("MCP server %r at %s: %d tools (%d allowed) in %.2f s", self.spec.server_label, self.where,
                  len(listed), len(tools), time.monotonic() - started)
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self.spec.allowed_tools is not None and name not in self.spec.allowed_tools:
            raise McpToolError(f"The tool '{name}' of MCP server '{self.spec.server_label}' is not in its "
                               "allowed_tools.")
        started = time.monotonic()
        result = await self._run(f"call {name!r}", lambda client: client.call_tool(name, arguments))
        log.debug("MCP server %r at %s: %r %s in %.2f s", self.spec.server_label, self.where, name,
                  "failed" if result.is_error else "answered", time.monotonic() - started)
        return ToolResult(_text(result), result.is_error, result.structured_content)

    # ---- connecting, and what failures mean ---------------------------------------------------------

    @asynccontextmanager
    async def _connect(self, seen: _Seen) -> AsyncIterator[Client]:
        await check_url(self.spec.server_url, self.policy)  # a clear refusal before any connection

        async def note(response: httpx2.Response) -> None:  # the SDK reports HTTP errors without the status
            seen.statuses.append(response.status_code)

        # identity: a compressed answer would be counted compressed and inflated past the budget
        http = httpx2.AsyncClient(headers={**self.spec.headers, "Accept-Encoding": "identity"},
                                  timeout=httpx2.Timeout(self.timeout_s),
                                  transport=_Capped(pinned_transport(self.policy), seen), trust_env=False,
                                  event_hooks={"response": [note]})
        async with http, Client(streamable_http_client(self.spec.server_url, http_client=http), cache=None,
                                client_info=CLIENT_INFO) as client:
            yield client

    async def _run(self, what: str, op: Callable[[Client], Awaitable[T]]) -> T:
        """`op` in a session of its own, under the deadline; failures as this module's errors."""
        seen = _Seen()
        try:
            with anyio.fail_after(self.timeout_s):
                async with self._connect(seen) as client:
                    result = await op(client)
        except TimeoutError:
            raise self._unavailable(what, seen.refusal or f"no answer within {self.timeout_s:g} s") from None
        except Exception as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # a session that broke as it closed: still a cancel
                raise asyncio.CancelledError() from e
            if seen.refusal is not None:  # however the SDK reported the answer it could not finish reading
                raise self._unavailable(what, seen.refusal) from None
            raise self._failure(what, e, seen.statuses) from None
        if seen.refusal is not None:  # a result despite a cut stream (the SDK may swallow the error)
            raise self._unavailable(what, seen.refusal)
        return result

    def _failure(self, what: str, error: Exception, statuses: list[int]) -> Exception:
        leaves = list(_leaves(error))
        for kind in (EgressRefused, McpToolError, McpUnavailable):
            for leaf in leaves:
                if isinstance(leaf, kind):
                    return leaf
        # The last response's status: an earlier error (a legacy server's 404 to the version probe) is no verdict.
        status = statuses[-1] if statuses and statuses[-1] >= 400 else None
        for leaf in leaves:
            if isinstance(leaf, MCPError):
                if status is not None and (status in _UNAVAILABLE_STATUSES or status >= 500):
                    return self._unavailable(what, _http_reason(status))
                if leaf.code in _TRANSPORT_CODES or leaf.message == _HTTP_ERROR:
                    return self._unavailable(what, leaf.message if status is None else _http_reason(status))
                # a JSON-RPC error: the server's answer to this request (unknown tool, bad arguments)
                return McpToolError(f"MCP server '{self.spec.server_label}' refused to {what}: {leaf.message}")
        leaf = leaves[0]
        if isinstance(leaf, socket.gaierror):
            return self._unavailable(what, f"the host name does not resolve ({leaf.strerror or leaf})")
        if isinstance(leaf, httpx2.TimeoutException):
            return self._unavailable(what, f"no answer within {self.timeout_s:g} s")
        if isinstance(leaf, httpx2.HTTPError | OSError):
            return self._unavailable(what, str(leaf) or type(leaf).__name__)
        if isinstance(leaf, ValidationError):
            return self._unavailable(what, "its answer is not valid MCP")
        log.warning("MCP server %r at %s: %s failed: %s", self.spec.server_label, self.where, what,
                    type(leaf).__name__)
        return self._unavailable(what, type(leaf).__name__)

    def _unavailable(self, what: str, reason: str) -> McpUnavailable:
        log.info("MCP server %r at %s: %s failed: %s", self.spec.server_label, self.where, what, reason)
        return McpUnavailable(f"MCP server '{self.spec.server_label}' at {self.where} is unreachable: {reason}")


@dataclass
class _Seen:
    """What one operation received: each response's status, its bytes, why it was cut off."""

    statuses: list[int] = field(default_factory=list)
    received: int = 0
    refusal: str | None = None


class AnswerRefused(Exception):
    """Raised into the SDK's read of an answer past the budget (or compressed): `_Seen.refusal`
    says why, whatever the SDK makes of the exception."""


class _Capped(httpx2.AsyncBaseTransport):
    """The transport, with every answer counted against the operation's `MAX_ANSWER_BYTES`."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, seen: _Seen) -> None:
        self.inner, self.seen = inner, seen

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.seen.refusal is not None:  # no further request (an SSE reconnect) once over the budget
            raise AnswerRefused(self.seen.refusal)
        response = await self.inner.handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            self.seen.refusal = f"it answered with Content-Encoding {encoding[:32]!r} (identity was asked for)"
            raise AnswerRefused(self.seen.refusal)
        return httpx2.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                               stream=_CappedStream(response.stream, self.seen))

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, seen: _Seen) -> None:
        self.inner, self.seen = inner, seen

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.seen.received += len(chunk)
            if self.seen.received > MAX_ANSWER_BYTES:
                self.seen.refusal = f"its answer is larger than {MAX_ANSWER_BYTES} bytes"
                raise AnswerRefused(self.seen.refusal)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


_HTTP_ERROR = "Server returned an error response"  # the SDK's stand-in for an HTTP error without a JSON-RPC body
# The endpoint, not the request, is the problem: no MCP server there, no access, overloaded.
_UNAVAILABLE_STATUSES = frozenset({401, 403, 404, 405, 406, 407, 408, 410, 415, 421, 429})


def _http_reason(status: int) -> str:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    hint = ": no MCP endpoint at this URL" if status in (404, 405) else ""
    return f"HTTP {status} {phrase}{hint}"


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions an ExceptionGroup (the SDK's task groups) holds, flattened; or the error."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _listed(tool: mcp_types.Tool) -> ListedTool:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    return ListedTool(tool.name, tool.description, dict(tool.input_schema), annotations or None)


def _text(result: mcp_types.CallToolResult) -> str:
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        # MCP servers should also send structured content as a text block; this is for those that don't.
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.EmbeddedResource):
        inner = block.resource
        if isinstance(inner, mcp_types.TextResourceContents):
            return inner.text
        return f"[binary resource {inner.uri} ({inner.mime_type or 'unknown type'})]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource {block.uri}{f': {block.name}' if block.name else ''}]"
    kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
    return f"[{kind} ({block.mime_type}), not shown]"
