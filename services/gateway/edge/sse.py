"""Server-sent event framing: chat and completions send `data:` lines only; Responses events also
carry their `event:` line (the spec: it must match the body's `type`). Streams end with `[DONE]`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(obj: Any) -> bytes:
    """One server-sent event: `data: <json>\\n\\n`."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_response_event(event: Mapping[str, Any]) -> bytes:
    """One Responses event with its `event:` line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def sse_response_stream(batches: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """Responses event batches as one event stream, then `[DONE]`. Closing this closes `batches`
    (Starlette closes it when the client disconnects), which cancels the worker call."""
    try:
        async for batch in batches:
            for event in batch:
                yield sse_response_event(event)
    finally:
        await batches.aclose()  # type: ignore[attr-defined]
    yield SSE_DONE
