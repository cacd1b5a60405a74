"""A hung engine: one with requests in it that shows no progress for `stall_timeout_s`.

A crashed engine is noticed by its process ending; a hung one (a deadlocked collective, a stuck
kernel, a stopped process) stays alive, and without this its replica would stay healthy and routed
while every request sent to it waits forever. Progress is what the engine shows: each step it
reports (vLLM's per-step statistics), each request that ends, and, when those have been quiet for
the limit, an answer to a probe only its working loop gives (llama-server's /metrics, answered
between two batches, so one long prompt is not mistaken for a hang). A request counts only while it
waits for the engine, not while its own reader is slow.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
DEFAULT_STALL_TIMEOUT_S = 300.0  # vLLM's own bound on one model step (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)


class StallWatch:
    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s  # 0: never
        self._clock = clock
        self._busy = 0  # requests waiting for the engine
        self._since = 0.0  # the last progress seen, or when the engine last became busy

    def waiting(self) -> None:
        """A request waits for the engine (its next step, its vectors); `answered` when that came
        (or failed). Not while the request's own reader is slow: that is no stall of the engine's."""
        if not self._busy:
            self._since = self._clock()  # idle time is not a stall
        self._busy += 1

    def answered(self) -> None:
        self._busy -= 1
        self._since = self._clock()  # the engine answered someone: progress

    async def next_step(self, steps: AsyncIterator[T]) -> T | None:
        """The engine's next step of a request (None after its last), waited for as `waiting` says
        (per step: ~0.35 µs more than `async for`)."""
        self.waiting()
        try:
            return await anext(steps, None)
        finally:
            self.answered()

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Around one wait for the engine (`waiting` ... `answered`)."""
        self.waiting()
        try:
            yield
        finally:
            self.answered()

    def progressed(self, at: float | None = None) -> None:
        self._since = max(self._since, self._clock() if at is None else at)

    def quiet_for(self, last_step_at: float = 0.0) -> float:
        """How long the engine has had work without progress, once that is past the limit
        (`last_step_at`: its own last step, on this clock); 0 otherwise, and when unwatched."""
        if not self._busy or self.limit_s <= 0:
            return 0.0
        quiet = self._clock() - max(self._since, last_step_at)
        return quiet if quiet > self.limit_s else 0.0
