"""Approved MCP calls (`mcp_approval_response` items of the input) in the tool loop: each approval
runs its call at most once, and they count against the response's call bound.

A client that keeps no state (`store: false`, or one that resends the conversation) sends back
every item of earlier turns: approvals already acted on, with the `mcp_call` that ran them. Those
calls ran again on every later turn (an approved "send the e-mail" sent once per turn)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.mcp.client import ToolResult
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.mcp_loop import MAX_CALLS_CEILING, run_mcp_turn
from services.gateway.responses.protocol import parse_response_request
from services.gateway.responses.protocol_mcp_events import McpStreamEncoder
from services.gateway.responses.turns import Turn

LABEL, TOOL = "w", "send_mail"
LISTED = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": LABEL,
          "tools": [{"name": TOOL, "input_schema": {"type": "object"}}]}


class Recording:
    """A client that records the calls it is asked to make."""

    calls: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def __init__(self, spec: Any) -> None:
        pass

    async def list_tools(self) -> list[Any]:
        raise AssertionError("the tools are listed in the chain")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        Recording.calls.append((name, arguments))
        return ToolResult("sent")


@pytest.fixture(autouse=True)
def no_calls_yet() -> None:
    Recording.calls = []


def request(n: int) -> dict[str, Any]:
    return {"type": "mcp_approval_request", "id": f"mcpr_{n}", "server_label": LABEL, "name": TOOL,
            "arguments": f'{{"to": "{n}"}}'}


def approve(n: int) -> dict[str, Any]:
    return {"type": "mcp_approval_response", "approval_request_id": f"mcpr_{n}", "approve": True}


def ran(n: int) -> dict[str, Any]:
    return {"type": "mcp_call", "id": f"mcp_{n}", "server_label": LABEL, "name": TOOL, "arguments": f'{{"to": "{n}"}}',
            "output": "sent", "approval_request_id": f"mcpr_{n}", "status": "completed"}


def turn(inputs: list[dict[str, Any]], history: list[dict[str, Any]] | None = None, **body: Any) -> Turn:
    server = {"type": "mcp", "server_label": LABEL, "server_url": "https://mcp.example.com/mcp"}
    req = parse_response_request({"model": "m", "input": "hi", "tools": [server], **body})
    return Turn(req, "me", history or [], inputs, McpStreamEncoder.for_request(req), pb.InferRequest())


async def no_model(infer: pb.InferRequest, first: bool) -> Any:
    raise OpenAIError(503, "no model in this test")


async def finish(out: Any) -> Any:
    return out


async def run(t: Turn) -> list[dict[str, Any]]:
    async for _ in run_mcp_turn(t, no_model, finish, clients=Recording):
        pass
    return [i for i in t.encoder.response["output"] if i["type"] == "mcp_call"]


async def test_a_resent_conversation_does_not_run_approved_calls_again() -> None:
    earlier = [{"role": "user", "content": "mail 1"}, LISTED, request(1), approve(1), ran(1)]
    await run(turn([*earlier, {"role": "user", "content": "and 2"}, request(2), approve(2)]))
    assert Recording.calls == [(TOOL, {"to": "2"})]


async def test_an_approval_answered_in_the_stored_history_is_not_run_again() -> None:
    await run(turn([approve(1)], history=[LISTED, request(1), approve(1), ran(1)]))
    assert Recording.calls == []


async def test_an_approval_given_twice_runs_its_call_once() -> None:
    await run(turn([approve(1), approve(1)], history=[LISTED, request(1)]))
    assert Recording.calls == [(TOOL, {"to": "1"})]


async def test_approved_calls_count_against_max_tool_calls() -> None:
    history = [LISTED, request(1), request(2), request(3)]
    calls = await run(turn([approve(1), approve(2), approve(3)], history=history, max_tool_calls=2))
    assert Recording.calls == [(TOOL, {"to": "1"}), (TOOL, {"to": "2"})]
    assert calls[-1]["status"] == "failed" and "max_tool_calls (2)" in calls[-1]["error"]["message"]


async def test_max_tool_calls_is_bounded_by_the_server() -> None:
    n = MAX_CALLS_CEILING + 1
    history = [LISTED, *(request(i) for i in range(n))]
    await run(turn([approve(i) for i in range(n)], history=history, max_tool_calls=10 * n))
    assert len(Recording.calls) == MAX_CALLS_CEILING
