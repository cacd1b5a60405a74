"""A worker call behind a stream is released however the stream ends: a turn closed at its opening
batch, an event-stream response whose client left before the first byte, a handler cancelled just
as its work finished. (Each leaked `Endpoint.outstanding` and the engine request before.) And a
chunk stream writes once per worker event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from services.gateway.chat.protocol import parse_chat_request
from services.gateway.chat.protocol_output import ChatStreamEncoder
from services.gateway.edge.disconnect import ClientDisconnected, unless_disconnected
from services.gateway.edge.sse import EventStreamResponse
from services.gateway.responses.protocol import parse_response_request
from services.gateway.responses.protocol_events import ResponseStreamEncoder
from services.gateway.responses.turns import EventBatches, run_turn
from services.gateway.serving import ChunkStream
from tests.unit.worker_events import TEXT

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

    handler = asyncio.ensure_future(unless_disconnected(Connected().receive, work()))
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert generation.closed == 1


async def test_a_result_that_comes_back_after_the_client_left_is_closed():
    generation = FakeGeneration()
    left = asyncio.Event()

    class Leaving:
        async def receive(self) -> dict[str, Any]:
            await left.wait()
            return {"type": "http.disconnect"}

    async def work() -> FakeGeneration:
        left.set()
        try:
            await asyncio.Event().wait()  # cancelled when the client leaves...
        except asyncio.CancelledError:
            pass  # ...but the call hands back its result all the same
        return generation

    with pytest.raises(ClientDisconnected):
        await unless_disconnected(Leaving().receive, work())
    assert generation.closed == 1
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # the cancel was taken back


async def test_an_event_stream_whose_client_left_mid_stream_ends_and_is_released():
    released, bodies = [], []
    left = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await asyncio.Event().wait()  # the next token never comes
        yield b"data: 2\n\n"  # pragma: no cover

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message["body"])
            left.set()  # the client leaves after the first chunk (uvicorn: later sends do nothing)

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/", "headers": []}
    await EventStreamResponse(body(), release=lambda: released.append(True))(scope, receive, send)
    assert bodies == [b"data: 1\n\n"] and released == [True]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


class ScriptedGeneration(FakeGeneration):
    """A worker call that sends `events`, then ends."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__()
        self.events = events

    async def __aiter__(self) -> AsyncIterator[Any]:
        for event in self.events:
            yield event


async def test_each_worker_event_is_one_write_and_the_last_goes_out_with_done():
    req = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "stream_options": {"include_usage": True}})
    generation = ScriptedGeneration(TEXT)
    writes = [w async for w in ChunkStream(generation, ChatStreamEncoder.for_request(req)).frames()]  # type: ignore[arg-type]
    events = [[json.loads(line[6:]) for line in w.decode().split("\n\n") if line.startswith("data: {")] for w in writes]
    assert [len(e) for e in events] == [2, 1, 2]  # role + "Hello"; ", world"; finish + usage
    assert writes[-1].endswith(b"data: [DONE]\n\n") and generation.closed == 1
    assert events[0][1]["choices"][0]["delta"]["content"] == "Hello" and events[2][1]["usage"]["completion_tokens"] == 7
