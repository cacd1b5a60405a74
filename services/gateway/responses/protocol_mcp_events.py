"""The stream of a response whose tools include MCP servers: the base encoder's events, plus the
MCP items the loop (`mcp_loop`) makes around the model's generations.

A call the model makes to an MCP tool becomes an `mcp_call` item, or an `mcp_approval_request`
when the server's `require_approval` asks for one, instead of a `function_call`. A generation that
ends with calls to run does not end the response: the loop runs them (`call_done`), and the next
generation continues the same output. Events follow the Responses API: `response.mcp_list_tools.*`,
`response.mcp_call.in_progress` / `response.mcp_call_arguments.delta|done` /
`response.mcp_call.completed|failed`, each item between its `output_item.added` and `.done`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.responses.protocol_events import ResponseStreamEncoder, new_item_id, usage_object

Events = list[dict[str, Any]]
# an exposed function name -> (server_label, MCP tool name, needs approval), or None: not an MCP tool
Resolver = Callable[[str], tuple[str, str, bool] | None]
_PREFIX = {"mcp_list_tools": "mcpl", "mcp_call": "mcp", "mcp_approval_request": "mcpr"}


class McpItem:
    def __init__(self, kind: str, index: int, server_label: str, name: str = "") -> None:
        self.kind, self.index, self.id = kind, index, new_item_id(_PREFIX[kind])
        self.server_label, self.name = server_label, name
        self.text, self.status, self.part_open = "", "in_progress", False  # text: the call's arguments
        self.tools: list[dict[str, Any]] = []
        self.output: str | None = None
        self.error: Any = None  # a listing's: a string; a call's: the API's typed error object
        self.approval_request_id: str | None = None

    def body(self) -> dict[str, Any]:
        base = {"id": self.id, "type": self.kind, "server_label": self.server_label}
        if self.kind == "mcp_list_tools":
            return {**base, "tools": self.tools, "error": self.error}
        if self.kind == "mcp_approval_request":
            return {**base, "name": self.name, "arguments": self.text}
        return {**base, "name": self.name, "arguments": self.text, "output": self.output, "error": self.error,
                "approval_request_id": self.approval_request_id, "status": self.status}


class McpStreamEncoder(ResponseStreamEncoder):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.resolve: Resolver = lambda _name: None  # set once the servers' tools are known
        self.pending: list[McpItem] = []  # calls of the last generation, for the loop to run
        self.approvals: list[McpItem] = []  # requests waiting for the user: they end the response
        self._usage: dict[str, Any] | None = None

    # ---- what the loop adds ---------------------------------------------------------------------

    def list_started(self, server_label: str) -> tuple[McpItem, Events]:
        item = self._add(McpItem("mcp_list_tools", len(self.items), server_label))
        return item, [self._added(item), self._on(item, "response.mcp_list_tools.in_progress")]

    def list_done(self, item: McpItem, tools: list[dict[str, Any]] | None, error: str | None = None) -> Events:
        item.tools, item.error, item.status = tools or [], error, "completed" if error is None else "failed"
        kind = "completed" if error is None else "failed"
        return [self._on(item, f"response.mcp_list_tools.{kind}"), self._done(item)]

    def approved_call(self, server_label: str, name: str, arguments: str, approval_request_id: str) -> tuple[
            McpItem, Events]:
        """A call the user approved (a previous response's request): run now, before any generation."""
        item = self._add(McpItem("mcp_call", len(self.items), server_label, name))
        item.text, item.approval_request_id = arguments, approval_request_id
        return item, [self._added(item), self._on(item, "response.mcp_call.in_progress"),
                      self._on(item, "response.mcp_call_arguments.done", arguments=arguments)]

    def call_done(self, item: McpItem, output: str | None, error: dict[str, Any] | None = None) -> Events:
        item.output, item.error = output, error
        item.status = "completed" if error is None else "failed"
        return [self._on(item, f"response.mcp_call.{item.status}"), self._done(item)]

    def take_pending(self) -> list[McpItem]:
        """The calls to run before the next generation, whose call indices start again at 0."""
        pending, self.pending = self.pending, []
        self.calls = {}
        return pending

    def complete(self) -> Events:
        """End as `completed` between generations (approval requests wait for the user)."""
        return [] if self.done else self._finish("completed")

    def fail_dependency(self, message: str) -> Events:
        """End as `failed` because an MCP server failed: a clear message, never an engine error."""
        if self.done:
            return []
        self.failed_dependency = True
        return self._finish("failed", error={"code": "server_error", "message": message})

    # ---- the model's calls ----------------------------------------------------------------------

    def _call(self, call: pb.ToolCallDelta) -> Events:
        out: Events = []
        item = self.calls.get(call.index, False)
        if item is False and (target := self.resolve(call.name)) is not None:
            label, tool, approval = target
            out = self._close()
            item = self._add(McpItem("mcp_approval_request" if approval else "mcp_call", len(self.items), label, tool))
            self.open = self.calls[call.index] = item  # type: ignore[assignment]
            if item.kind == "mcp_call":
                out += [self._added(item), self._on(item, "response.mcp_call.in_progress")]
        if not isinstance(item, McpItem):
            return super()._call(call)
        item.text += call.arguments
        if item.kind == "mcp_call" and item is self.open and call.arguments:
            out.append(self._on(item, "response.mcp_call_arguments.delta", delta=call.arguments))
        return out

    def _close(self, status: str = "completed") -> Events:
        item = self.open
        if not isinstance(item, McpItem):
            return super()._close(status)
        self.open = None
        if item.kind == "mcp_approval_request":  # announced whole, once its arguments are complete
            self.approvals.append(item)
            return [self._added(item), self._done(item)]
        out = [self._on(item, "response.mcp_call_arguments.done", arguments=item.text)]
        if status != "completed":  # the generation stopped inside the call: it is never run
            item.status = "incomplete"
            return [*out, self._done(item)]
        self.pending.append(item)
        return out

    def _final(self, final: pb.Final) -> Events:
        self._usage = _sum(self._usage, usage_object(final.usage))
        reason = {c.index: c.finish_reason for c in final.choices}.get(0, pb.FINISH_REASON_STOP)
        if reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_TOOL_CALLS):
            out = self._close()
            if self.pending:  # the loop runs them and generates again
                return out
            if self.approvals:
                return [*out, *self._finish("completed")]
            return [*out, *super()._final(final)]
        return super()._final(final)

    def _finish(self, status: str, **kw: Any) -> Events:
        if self._usage is not None:  # every generation's tokens, not only the last one's
            self.usage = self._usage
        return super()._finish(status, **kw)

    # ---- helpers --------------------------------------------------------------------------------

    def _add(self, item: McpItem) -> McpItem:
        self.items.append(item)  # type: ignore[arg-type]
        return item

    def _added(self, item: McpItem) -> dict[str, Any]:
        return self._event("response.output_item.added", output_index=item.index, item=item.body())

    def _done(self, item: McpItem) -> dict[str, Any]:
        return self._event("response.output_item.done", output_index=item.index, item=item.body())


def _sum(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return a or b
    return {k: _sum(v, b.get(k)) if isinstance(v, dict) else v + b.get(k, 0) for k, v in a.items()}
