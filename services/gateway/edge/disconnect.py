"""Client disconnects while waiting: cancel the work (and so the engine request) at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class ClientDisconnected(Exception):
    pass


class Receiver(Protocol):
    """The part of a Starlette request this reads."""

    async def receive(self) -> Any: ...


async def _disconnected(request: Receiver) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Receiver, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the HTTP client disconnects first (also before any byte), or
    if this waiter is itself cancelled (the server cancelled the handler): the work never outlives
    its handler, so a worker call it opened is cancelled and its endpoint count released."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _discard(task)
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    await _discard(task)
    raise ClientDisconnected()


async def _discard(task: asyncio.Future[Any]) -> None:
    """Stop `task` and wait for it to end (without taking this task's own cancellation). A result
    it produced anyway (it won the race) has nobody to use it: it is closed, if it can be."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is None:
        close = getattr(task.result(), "close", None)
        if callable(close):
            close()
