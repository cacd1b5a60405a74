"""WebSocket mode of `/v1/responses`: `response.create` messages on one socket, one turn at a time,
events back as JSON messages.

The socket keeps the conversation of its latest response in memory, so a turn can continue
from it with `previous_response_id` even when it was not stored (`store: false`). An id that is
neither that nor a stored response of the caller is `previous_response_not_found`, and so is the
latest id once a continuation from it failed (its cached state is dropped, as the spec requires).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from services.gateway.identity import caller_of
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.protocol_common.validation import decode_json
from services.gateway.responses.protocol import ResponseRequest, parse_response_request
from services.gateway.responses.serving import ResponsesServing

TRANSPORT_FIELDS = ("stream", "background", "stream_options")


def _error(err: OpenAIError) -> dict[str, Any]:
    """The spec's WebSocketErrorEvent; its `code` is required, so errors without one carry their type."""
    return {"type": "error", "status": err.status, "error": {**err.body()["error"], "code": err.code or err.type}}


class ResponsesSocket:
    def __init__(self, serving: ResponsesServing, ws: WebSocket) -> None:
        self.serving, self.ws = serving, ws
        self.caller = caller_of(ws)
        self.latest: tuple[str, list[dict[str, Any]]] | None = None  # (response id, its conversation)

    async def serve(self) -> None:
        """Turns one after another. The socket is read during a turn too: a client that hangs up
        mid-turn cancels it (and its worker call) at once, not at the turn's next send; messages
        that arrive meanwhile wait, in order, for the turn to end (and the socket is still watched)."""
        await self.ws.accept()
        arrived: collections.deque[dict[str, Any]] = collections.deque()  # read, not yet answered
        receiving: asyncio.Future | None = asyncio.ensure_future(self.ws.receive())
        turn: asyncio.Future | None = None
        try:
            while True:
                if not arrived:
                    assert receiving is not None
                    arrived.append(await receiving)
                    receiving = None
                message = arrived.popleft()
                if message["type"] == "websocket.disconnect":
                    return
                turn = asyncio.ensure_future(self._answer(message.get("text") or ""))
                while not turn.done():
                    if receiving is None:
                        receiving = asyncio.ensure_future(self.ws.receive())
                    await asyncio.wait({turn, receiving}, return_when=asyncio.FIRST_COMPLETED)
                    if receiving.done():
                        arrived.append(received := receiving.result())
                        receiving = None
                        if received["type"] == "websocket.disconnect":  # gone: nothing more is answered
                            turn.cancel()
                            await asyncio.wait({turn})  # (this task's own cancellation still propagates)
                            return
                failure = None if turn.cancelled() else turn.exception()
                if failure is not None and not isinstance(failure, WebSocketDisconnect):
                    raise failure
        finally:
            for task in (receiving, turn):
                if task is not None:
                    task.cancel()

    async def _answer(self, message: str) -> None:
        try:
            await self.turn(message)
        except OpenAIError as e:
            await self.ws.send_json(_error(e))

    def _parse(self, message: str) -> ResponseRequest:
        body = decode_json(message)
        if not isinstance(body, dict) or body.get("type") != "response.create":
            raise OpenAIError(400, "Expected a 'response.create' message.", param="type")
        for name in TRANSPORT_FIELDS:
            if name in body:
                raise OpenAIError(400, f"'{name}' is not used over a WebSocket: every response is streamed on "
                                  "the socket, and background responses are not supported here.", param=name)
        body.pop("type")
        return parse_response_request(body)

    def _history(self, previous_id: str | None) -> list[dict[str, Any]] | None:
        if not previous_id:
            return []
        if self.latest is not None and self.latest[0] == previous_id:
            return self.latest[1]
        return None  # not this socket's latest: only a stored response of this caller will do

    async def turn(self, message: str) -> None:
        req = self._parse(message)
        try:
            turn = await self.serving.prepare(req, self.caller, len(message),
                                             history=self._history(req.previous_response_id))
            generation = None if turn.runs_tools else await self.serving.open(turn)  # MCP: the loop opens
        except OpenAIError:
            self._drop(req.previous_response_id)  # refused, or the call failed before its first event
            raise
        # aclosing: a socket that closes mid-turn ends the generator now, which cancels the call
        async with contextlib.aclosing(self.serving.stream(turn, generation)) as batches:
            async for batch in batches:
                for event in batch:
                    await self.ws.send_json(event)
        if turn.encoder.status == "failed":
            self._drop(req.previous_response_id)
        else:
            self.latest = (turn.encoder.id, turn.conversation)

    def _drop(self, previous_id: str | None) -> None:
        """A failed continuation takes its cached parent with it."""
        if previous_id and self.latest is not None and self.latest[0] == previous_id:
            self.latest = None
