"""The requests a worker is running or queueing, by request id (Cancel by id, the load it reports).

Request ids are the platform's own (a new one per request), so a call for an id still running here
is that request made again: its caller's connection broke before the first token and the caller
tried the same replica once more, possibly before this worker saw the older call go (a connection
that died silently is noticed only by keepalive). The servicer cancels the older one, waits here
until it `ended`, and lets the new one in.
"""

from __future__ import annotations

import asyncio
import contextlib


class InflightRequests:
    def __init__(self) -> None:
        self._running: dict[str, asyncio.Event] = {}  # request id -> set once it ended

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._running

    def __len__(self) -> int:
        return len(self._running)

    def add(self, request_id: str) -> asyncio.Event:
        """`request_id` runs now; give what this returns to `release`."""
        ended = self._running[request_id] = asyncio.Event()
        return ended

    def release(self, request_id: str, admitted: asyncio.Event) -> None:
        """The request `add` admitted ended (not one that superseded it meanwhile). Not by task: a
        handler's generator may be finalized in a task of its own."""
        if self._running.get(request_id) is admitted:
            del self._running[request_id]
        admitted.set()

    async def ended(self, request_id: str, timeout_s: float) -> bool:
        """Whether `request_id` is not running here, waiting up to `timeout_s` for it to end."""
        ended = self._running.get(request_id)
        if ended is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), timeout_s)
        return request_id not in self._running
