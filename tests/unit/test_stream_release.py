"""A worker call behind a stream is released however the stream ends: a turn closed at its opening
batch, an event-stream response whose client left before the first byte, a handler cancelled just
as its work finished. (Each leaked `Endpoint.outstanding` and the engine request before.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from services.gateway.edge.disconnect import unless_disconnected
from services.gateway.edge.sse import EventStreamResponse
from services.gateway.responses.protocol import parse_response_request
from services.gateway.responses.protocol_events import ResponseStreamEncoder
from services.gateway.responses.turns import EventBatches, run_turn

pytestmark = pytest.mark.timeout(10)


class FakeGeneration:
    """A worker call that never sends an event: only whether it was closed matters here."""

    def __init__(self) -> None:
        self.closed = 0

    async def __aiter__(self) -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield  # pragma: no cover

    def close(self) -> None:
        self.closed += 1


async def passthrough(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return out


def encoder() -> ResponseStreamEncoder:
    return ResponseStreamEncoder.for_request(parse_response_request({"model": "m", "input": "hi"}))


async def test_a_turn_closed_at_its_opening_batch_closes_the_worker_call():
    generation = FakeGeneration()
    enc = encoder()
    turn = run_turn(enc, generation, passthrough, opening=enc.start())  # type: ignore[arg-type]
    assert next(e["type"] for e in await turn.__anext__()) == "response.created"
    await turn.aclose()
    assert generation.closed == 1


async def test_batches_never_iterated_are_released():
    generation = FakeGeneration()
    enc = encoder()
    batches = EventBatches(run_turn(enc, generation, passthrough, opening=enc.start()), generation)  # type: ignore[arg-type]
    batches.release()
    assert generation.closed == 1


async def test_an_event_stream_whose_client_left_before_the_first_byte_is_released():
    started, released = [], []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield b"data: {}\n\n"

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client is gone")

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/", "headers": []}
    with pytest.raises(ClientDisconnect):
        await EventStreamResponse(body(), release=lambda: released.append(True))(scope, receive, send)
    assert released == [True] and started == []  # the body never ran: only `release` could free the call


async def test_a_handler_cancelled_as_its_work_finished_closes_the_result():
    generation = FakeGeneration()
    handler: asyncio.Task[Any]

    class Connected:
        async def receive(self) -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

    async def work() -> FakeGeneration:
        handler.cancel()  # the handler is cancelled, and then the work returns its open call
        return generation

    handler = asyncio.ensure_future(unless_disconnected(Connected(), work()))
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert generation.closed == 1
