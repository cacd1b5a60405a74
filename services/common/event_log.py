"""An append-only, in-memory event log that any number of followers read from an offset.

One helper for every "events so far, then new ones until the end" stream: a deploy's progress
(coordinator), a model load's progress (worker) and a background run's replay log (memory://
state). Appending is synchronous (no lock to take), so a writer never yields between deciding and
recording; followers wake on the next append, close or failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class EventLog(Generic[T]):
    def __init__(self, events: Iterable[T] = ()) -> None:
        self._events: list[T] = list(events)
        self.closed = False
        self._error: BaseException | None = None
        self._wake = asyncio.Event()

    @property
    def events(self) -> Sequence[T]:
        """Everything appended so far (read-only: only `append` adds)."""
        return self._events

    def __len__(self) -> int:
        return len(self._events)

    def append(self, *events: T, close: bool = False) -> None:
        """Record `events` (and end the log when `close`); appending to a closed log is an error."""
        if self.closed:
            raise RuntimeError("append to a closed event log")
        self._events.extend(events)
        self.closed = close
        self._notify()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._notify()

    def fail(self, error: BaseException) -> None:
        """End the log: followers that have read everything raise `error` (e.g. its owner was deleted)."""
        self._error = error
        self.close()

    async def follow(self, start: int = 0) -> AsyncIterator[T]:
        """Events from index `start` on, waiting for new ones until the log is closed."""
        seen = max(0, start)
        while True:
            while seen < len(self._events):
                seen += 1
                yield self._events[seen - 1]
            if self.closed:
                if self._error is not None:
                    raise self._error
                return
            await self._wake.wait()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()
