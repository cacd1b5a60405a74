"""The server-side MCP tool loop of one response: list each server's tools (or take them from an
earlier `mcp_list_tools` of the chain), run the calls the user approved, then generate; each
generation that ends in calls to MCP tools has them run here and generates again, with their
results, until the model answers, asks for an approval, or a bound is reached.

Bounds: `max_tool_calls` (the request's, at most `MAX_CALLS_CEILING`) on the calls run, approved
ones included; past it, or after `MAX_GENERATIONS` generations, the last generation is offered no
MCP tools, so the model answers with what it has. An approval runs its call once: one whose call
the conversation already holds (a client that resends earlier turns' items) or that the input
gives twice is not run again.
A server that cannot be reached (or that the egress policy refuses) fails the response with a
clear message; a tool that fails is an `mcp_call` with its `error`, which the model is shown.
Cancelling the task (a client that leaves, a background cancel) stops the loop where it is: the
generation's worker call is cancelled and no further tool call is made."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError
from services.common.routes import RouteTable
from services.gateway.generation import Generation
from services.gateway.mcp.egress import EgressRefused
from services.gateway.mcp.tools import McpServerSpec, ToolDirectory
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.protocol_items import to_messages
from services.gateway.responses.protocol_mcp_events import McpItem, McpStreamEncoder
from services.gateway.responses.truncation import open_fitting
from services.gateway.responses.turns import Events, Finish, Turn

if TYPE_CHECKING:  # the SDK is imported with the first MCP request: it imports OpenTelemetry, which a
    # platform without --otel-endpoint must not load (tests/unit/test_tracing.py)
    from services.gateway.mcp.client import McpClient

MAX_GENERATIONS = 8  # per response: a model that keeps calling tools still ends
MAX_CALLS = 32  # MCP calls per response when the request sets no max_tool_calls
MAX_CALLS_CEILING = 128  # ... and whatever it sets: each call may take MSHIP_MCP_TIMEOUT_S
INVALID_PARAMS, INTERNAL_ERROR = -32602, -32603  # JSON-RPC's codes, as MCP uses them
OpenGeneration = Callable[[pb.InferRequest, bool], Awaitable[Generation]]  # (request, is the first one)


def opener(table: RouteTable, turn: Turn) -> OpenGeneration:
    """The turn's generations: the first one settles the request's admission, the later ones
    (continuations with tool results) are charged to the same budget as they end."""
    async def open_(infer: pb.InferRequest, first: bool) -> Generation:
        return await open_fitting(table, turn, infer, turn.ticket if first else turn.ticket.follow_on(),
                                  output=turn.encoder.response["output"])
    return open_


def listed_in_chain(items: list[dict[str, Any]], spec: McpServerSpec) -> list[dict[str, Any]] | None:
    """The tools an earlier `mcp_list_tools` of the conversation listed for this server, if any."""
    for item in reversed(items):
        if item.get("type") == "mcp_list_tools" and item.get("server_label") == spec.server_label \
                and not item.get("error"):
            return list(item.get("tools") or [])
    return None


def approval_requests(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["id"]: i for i in items if i.get("type") == "mcp_approval_request"}


def approvals_to_run(history: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input's approvals whose calls have not run: each once, none whose `mcp_call` the
    conversation already holds (a turn that ran an approved call outputs it at once)."""
    done = {i.get("approval_request_id") for i in [*history, *inputs] if i.get("type") == "mcp_call"}
    out = []
    for item in inputs:
        rid = item.get("approval_request_id")
        if item.get("type") == "mcp_approval_response" and item.get("approve") and rid not in done:
            done.add(rid)
            out.append(item)
    return out


def check_approvals(history: list[dict[str, Any]], inputs: list[dict[str, Any]],
                    servers: list[McpServerSpec]) -> None:
    """Every `mcp_approval_response` of the input answers an approval request of the conversation,
    of a server this request still names; anything else is a 400 naming the item."""
    requests, labels = approval_requests([*history, *inputs]), {s.server_label for s in servers}
    for index, item in enumerate(inputs):
        if item.get("type") != "mcp_approval_response":
            continue
        request = requests.get(item["approval_request_id"])
        if request is None:
            raise OpenAIError(400, f"No MCP approval request found with id '{item['approval_request_id']}': it "
                              "must be an mcp_approval_request of the previous response or of this input.",
                              param=f"input[{index}].approval_request_id")
        if request["server_label"] not in labels:
            raise OpenAIError(400, f"The approval request '{request['id']}' is for the MCP server "
                              f"'{request['server_label']}', which is not in 'tools'.",
                              param=f"input[{index}].approval_request_id")


async def run_mcp_turn(turn: Turn, open_generation: OpenGeneration, finish: Finish,
                       opening: Events | None = None, clients: Callable[[McpServerSpec], McpClient] | None = None,
                       before_call: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Events]:
    """Like `turns.run_turn`, for a turn whose tools include MCP servers; the last batch holds the
    terminal event and passes through `finish`. `before_call` runs before each tool call and may
    raise to stop the loop (a background run cancelled from another replica: no call after that)."""
    from services.gateway.mcp.client import McpClient, McpToolError, McpUnavailable

    clients = clients or McpClient
    encoder = turn.encoder
    assert isinstance(encoder, McpStreamEncoder)
    servers = {s.server_label: s for s in turn.req.mcp_servers}
    directory = ToolDirectory(reserved=turn.req.tool_names)  # the request's own functions keep their names
    generation: Generation | None = None
    out: Events = []
    try:
        if opening:
            yield opening
        chain = [*turn.history, *turn.inputs]
        for spec in servers.values():
            tools = listed_in_chain(chain, spec)
            if tools is None:
                item, started = encoder.list_started(spec.server_label)
                yield started
                try:
                    tools = [t.as_dict() for t in await clients(spec).list_tools()]
                except (McpUnavailable, McpToolError, EgressRefused) as e:  # refused `initialize` or `tools/list`
                    out = [*encoder.list_done(item, None, str(e)), *encoder.fail_dependency(
                        f"Error retrieving tool list from MCP server '{spec.server_label}': {e}")]
                    break
                yield encoder.list_done(item, tools)
            directory.add(spec, tools)
        encoder.resolve = directory.target
        calls, limit = 0, min(turn.req.max_tool_calls or MAX_CALLS, MAX_CALLS_CEILING)
        requests = approval_requests(chain)
        for answer in approvals_to_run(turn.history, turn.inputs) if not out else []:
            request = requests[answer["approval_request_id"]]  # checked in `prepare`
            item, started = encoder.approved_call(request["server_label"], request["name"], request["arguments"],
                                                  request["id"])
            yield started
            if calls >= limit:
                yield encoder.call_done(item, None, protocol_error(
                    INTERNAL_ERROR, f"Not run: the response reached max_tool_calls ({limit})."))
                continue
            calls += 1
            if before_call is not None:
                await before_call()
            yield await _run_call(clients(servers[item.server_label]), encoder, item)
        infer = pb.InferRequest()
        infer.CopyFrom(turn.infer)
        for round_ in range(MAX_GENERATIONS if not out else 0):
            offer = calls < limit and round_ < MAX_GENERATIONS - 1  # else the model answers with what it has
            _set_chat(infer, turn, encoder, directory.function_tools() if offer else [])
            generation = await open_generation(infer, round_ == 0)
            async for event in generation:
                batch = encoder.encode(event)
                if encoder.done:  # the terminal batch goes out through `finish`
                    out = batch
                    break
                if batch:
                    yield batch
            generation.close()
            generation = None
            if encoder.done:
                break
            if not encoder.pending and not encoder.approvals:
                out = encoder.fail()  # the generation ended without a Final
                break
            for item in encoder.take_pending():
                if calls >= limit:
                    yield encoder.call_done(item, None, protocol_error(
                        INTERNAL_ERROR, f"Not run: the response reached max_tool_calls ({limit})."))
                    continue
                calls += 1
                if before_call is not None:
                    await before_call()
                yield await _run_call(clients(servers[item.server_label]), encoder, item)
            if encoder.approvals:  # the turn ends: the user approves or denies, then the next one resumes
                out = encoder.complete()
                break
        if not out:  # every generation ended in calls (the last one was offered no tools, yet called)
            out = encoder.complete()
    except UpstreamError as e:
        assert generation is not None
        out = encoder.error_out(generation.failure(e))
    except OpenAIError as e:  # a continuation that could not start (the model went away, overload)
        out = encoder.error_out(e)
    finally:
        if generation is not None:
            generation.close()
        turn.ticket.settle(0)  # no generation took it (a tool list failed, the client left): it goes back
    yield await finish(out)


def _set_chat(infer: pb.InferRequest, turn: Turn, encoder: McpStreamEncoder, tools: list[dict[str, Any]]) -> None:
    """The next generation's request: the conversation with this response's output so far, and
    the function tools plus (while offered) the MCP servers' tools."""
    if encoder.items:  # approved calls ran, or tools were called: the chat goes on from the output
        messages = to_messages(turn.req.instructions, turn.context, encoder.response["output"])
        del infer.chat.messages[:]
        infer.chat.messages.extend(messages)
    del infer.tools[len(turn.infer.tools):]
    infer.tools.extend(pb.Tool(name=t["name"], description=t.get("description") or "",
                               parameters_json=json.dumps(t.get("parameters") or {})) for t in tools)


async def _run_call(client: McpClient, encoder: McpStreamEncoder, item: McpItem) -> Events:
    """Run one call; its failure is the `mcp_call`'s `error`, typed as the Responses API types it."""
    from services.gateway.mcp.client import McpToolError, McpUnavailable

    try:
        arguments = json.loads(item.text or "{}")
        if not isinstance(arguments, dict):
            raise ValueError("the arguments are not a JSON object")
    except ValueError as e:
        return encoder.call_done(item, None, protocol_error(INVALID_PARAMS, f"Invalid arguments: {e}"))
    try:
        result = await client.call_tool(item.name, arguments)
    except McpToolError as e:
        return encoder.call_done(item, None, protocol_error(INTERNAL_ERROR, str(e)))
    except (McpUnavailable, EgressRefused) as e:
        return encoder.call_done(item, None, {"type": "http_error", "code": 503, "message": str(e)})
    if result.is_error:  # the tool ran and failed: what it said
        return encoder.call_done(item, None, {"type": "mcp_tool_execution_error",
                                              "content": [{"type": "text", "text": result.text}]})
    return encoder.call_done(item, result.text)


def protocol_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "mcp_protocol_error", "code": code, "message": message}
