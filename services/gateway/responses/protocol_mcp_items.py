"""The MCP items of `/v1/responses` (OpenAI's remote MCP tool), as a response outputs them and a
client sends them back as input: `mcp_list_tools` (a server's tools), `mcp_call` (a call the
server ran, with its output or error), `mcp_approval_request` (a call waiting for the user) and
the client's `mcp_approval_response`. The loop that makes them is `mcp_loop`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from services.gateway.protocol_common.validation import Str, WireModel

ItemId = Annotated[Str, Field(min_length=1, max_length=128)]
Label = Annotated[Str, Field(min_length=1, max_length=64)]
MCP_ITEM_TYPES = ("mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response")
DENIED = "The user did not approve this tool call."  # what the model is told of a denial


def error_text(error: dict[str, Any] | str) -> str:
    """An `mcp_call` error as the model reads it in the tool's result."""
    if isinstance(error, str):
        return error
    content = error.get("content")
    if isinstance(content, list):
        return " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(error.get("message", ""))


class ListedTool(WireModel):
    name: Str
    description: Str | None = None
    input_schema: dict[Str, Any] | None = None
    annotations: dict[Str, Any] | None = None


class McpListToolsItem(WireModel):
    type: Literal["mcp_list_tools"]
    server_label: Label
    tools: list[ListedTool]
    id: ItemId | None = None
    error: Str | None = None


class McpCallItem(WireModel):
    type: Literal["mcp_call"]
    id: ItemId
    server_label: Label
    name: Str
    arguments: Str
    output: Str | None = None
    error: dict[Str, Any] | Str | None = None  # the API's typed error (older clients: a string)
    approval_request_id: ItemId | None = None
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | None = None


class McpApprovalRequestItem(WireModel):
    type: Literal["mcp_approval_request"]
    id: ItemId
    server_label: Label
    name: Str
    arguments: Str


class McpApprovalResponseItem(WireModel):
    type: Literal["mcp_approval_response"]
    approval_request_id: ItemId
    approve: bool
    id: ItemId | None = None
    reason: Str | None = None
