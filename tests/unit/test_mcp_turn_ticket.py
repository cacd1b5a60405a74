"""An MCP turn's token reservation (its admission ticket) is settled however the turn ends, also
when no generation ever took it: a tool list that failed, a client that left while tools were
listed. Unsettled, the whole reservation stayed charged to the caller's tokens-per-minute bucket
(spurious 429s for up to a minute)."""

from __future__ import annotations

import asyncio
from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.admission.admission import Ticket
from services.gateway.mcp.client import McpUnavailable
from services.gateway.responses.mcp_loop import run_mcp_turn
from services.gateway.responses.protocol import parse_response_request
from services.gateway.responses.protocol_mcp_events import McpStreamEncoder
from services.gateway.responses.turns import Turn
from tests.helpers import until


class Refunds:
    """The admission's side of a ticket: what each settlement gives back."""

    def __init__(self) -> None:
        self.given_back: list[int] = []

    def adjust_later(self, key: str, limit: int, delta: int) -> None:
        self.given_back.append(delta)


def mcp_turn(admission: Refunds) -> Turn:
    server = {"type": "mcp", "server_label": "w", "server_url": "https://mcp.example.com/mcp",
              "require_approval": "never"}
    req = parse_response_request({"model": "m", "input": "hi", "tools": [server]})
    return Turn(req, "me", [], [], McpStreamEncoder.for_request(req), pb.InferRequest(),
                Ticket(admission, key="k", limit=1000, reserved=500, prompt_estimate=20))  # type: ignore[arg-type]


class Unreachable:
    def __init__(self, spec: Any) -> None:
        pass

    async def list_tools(self) -> list[Any]:
        raise McpUnavailable("unreachable")


class Listing:
    listing = asyncio.Event()

    def __init__(self, spec: Any) -> None:
        pass

    async def list_tools(self) -> list[Any]:
        Listing.listing.set()
        await asyncio.Event().wait()
        return []


async def no_generation(infer: pb.InferRequest, first: bool) -> Any:
    raise AssertionError("the turn opens no generation")


async def finish(out: Any) -> Any:
    return out


async def test_a_turn_whose_tool_list_failed_gives_its_reservation_back() -> None:
    admission = Refunds()
    turn = mcp_turn(admission)
    async for _ in run_mcp_turn(turn, no_generation, finish, clients=Unreachable):
        pass
    assert not turn.ticket.counts_tokens and admission.given_back == [500]


async def test_a_turn_whose_client_left_while_tools_were_listed_gives_its_reservation_back() -> None:
    admission = Refunds()
    turn = mcp_turn(admission)

    async def consume() -> None:
        async for _ in run_mcp_turn(turn, no_generation, finish, clients=Listing):
            pass

    task = asyncio.ensure_future(consume())
    await until(Listing.listing.is_set, "the tool list to be asked for")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not turn.ticket.counts_tokens and admission.given_back == [500]


def test_a_continuation_is_charged_to_the_turns_budget_and_recorded():
    """A turn's later generations (tool results sent back) use tokens too: charged as they end,
    against the same budget, and added to the caller's recorded usage (the audit trail)."""
    from services.gateway.identity import Caller

    admission, caller = Refunds(), Caller("me", "127.0.0.1")
    first = Ticket(admission, key="k", limit=1000, reserved=500, record=caller)  # type: ignore[arg-type]
    first.settle(120)
    later = first.follow_on()
    later.settle(80)
    later.settle(80)  # once
    assert admission.given_back == [380, -80] and caller.used_tokens == 200
    assert Ticket().follow_on().counts_tokens is False  # nothing to charge without a limit or a record
