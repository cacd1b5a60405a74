"""Client disconnects while waiting or streaming: cancel the work (and so the engine request) at
once. The work runs in the caller's own task and one watcher task cancels it: one task more per
wait, not a task for the work beside the watcher (nor, for a streamed body, Starlette's anyio task
group: under uvicorn's ASGI 2.3 a send to a client that has gone raises nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
Receive = Callable[[], Awaitable[Any]]


class ClientDisconnected(Exception):
    pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work` in this task; ClientDisconnected once the ASGI `receive` reports
    `http.disconnect` (also before any byte), the work cancelled and its cleanup done. If this task
    is itself cancelled (the server cancelled the handler) the work is cancelled with it: it never
    outlives its handler, so a worker call it opened is cancelled and its endpoint count released.
    A result that comes back although the task was cancelled meanwhile has nobody to use it: it is
    closed, if it can be."""
    task = asyncio.current_task()
    assert task is not None
    gone, cancels = False, task.cancelling()

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
        if task.cancelling() > cancels:  # cancelled as the work finished: the result goes unused
            close = getattr(result, "close", None)
            if callable(close):
                close()
            raise asyncio.CancelledError()
        return result
    except asyncio.CancelledError:
        if gone and task.uncancel() == cancels:  # the watcher's cancel, and no one else's
            raise ClientDisconnected() from None
        raise
    finally:
        watcher.cancel()
