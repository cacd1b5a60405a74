"""Server-sent event framing: chat and completions send `data:` lines only; Responses events also
carry their `event:` line (the spec: it must match the body's `type`). Streams end with `[DONE]`.
`EventStreamResponse` sends one and releases the worker call behind it when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.gateway.edge.disconnect import ClientDisconnected, unless_disconnected
from services.gateway.edge.json_response import encode_json

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(obj: Any) -> bytes:
    """One server-sent event: `data: <json>\\n\\n`."""
    return b"data: " + encode_json(obj) + b"\n\n"


def sse_response_event(event: Mapping[str, Any]) -> bytes:
    """One Responses event with its `event:` line."""
    return b"event: " + event["type"].encode() + b"\ndata: " + encode_json(event) + b"\n\n"


class Batches(Protocol):
    """Batches of events to send, closed by whoever sends them."""

    def __aiter__(self) -> AsyncIterator[list[dict[str, Any]]]: ...
    async def aclose(self) -> None: ...


async def sse_response_stream(batches: Batches) -> AsyncIterator[bytes]:
    """Responses event batches as one event stream, then `[DONE]`. Closing this closes `batches`
    (Starlette closes it when the client disconnects), which cancels the worker call."""
    try:
        async for batch in batches:  # one write per batch: the events one worker event made
            if batch:
                yield b"".join(sse_response_event(event) for event in batch)
    finally:
        await batches.aclose()
    yield SSE_DONE


class ReleasingResponse(StreamingResponse):
    """A streamed response that calls `release` when it ends, however it ends. A client that leaves
    before the first byte skips the body, whose own `finally` then never runs: without this, the
    worker call it streams would stay open (and its endpoint count held). The body streams in the
    handler's task, cancelled when the client disconnects (`unless_disconnected`)."""

    def __init__(self, body: AsyncIterator[bytes], release: Callable[[], None], media_type: str,
                 headers: Mapping[str, str]) -> None:
        super().__init__(body, media_type=media_type, headers=dict(headers))
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_disconnected(receive, self.stream_response(send))
        except ClientDisconnected:
            pass
        except OSError as e:  # a server that raises on a send to a client gone (ASGI 2.4)
            raise ClientDisconnect() from e
        finally:
            self._release()


class EventStreamResponse(ReleasingResponse):
    """An SSE stream (`frames`), released however it ends. The write that carries `[DONE]` ends the
    body too (Starlette's own sends an empty end after it: one write more per stream)."""

    def __init__(self, body: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(body, release, "text/event-stream", SSE_HEADERS)

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        more = True
        async for chunk in self.body_iterator:
            more = not chunk.endswith(SSE_DONE)
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
        if more:  # a body that did not end with [DONE]
            await send({"type": "http.response.body", "body": b"", "more_body": False})
