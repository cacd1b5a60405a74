"""A hung engine: one with requests in it that shows no progress for `stall_timeout_s`.

A crashed engine is noticed by its process ending; a hung one (a deadlocked collective, a stuck
kernel, a stopped process) stays alive, and without this its replica would stay healthy and routed
while every request sent to it waits forever. Progress is what the engine shows: each step it
reports (vLLM's per-step statistics), each request that ends, and, when those have been quiet for
the limit, an answer to a probe only its working loop gives (llama-server's /metrics, answered
between two batches, so one long prompt is not mistaken for a hang). Nothing is done per token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

DEFAULT_STALL_TIMEOUT_S = 300.0  # vLLM's own bound on one model step (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)


class StallWatch:
    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s  # 0: never
        self._clock = clock
        self._busy = 0  # requests in the engine
        self._since = 0.0  # the last progress seen, or when the engine last became busy

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Around one request's time in the engine (not its wait for a place in it)."""
        if not self._busy:
            self._since = self._clock()  # idle time is not a stall
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            self._since = self._clock()  # a request that ends is progress

    def progressed(self, at: float | None = None) -> None:
        self._since = max(self._since, self._clock() if at is None else at)

    def quiet_for(self, last_step_at: float = 0.0) -> float:
        """How long the engine has had work without progress, once that is past the limit
        (`last_step_at`: its own last step, on this clock); 0 otherwise, and when unwatched."""
        if not self._busy or self.limit_s <= 0:
            return 0.0
        quiet = self._clock() - max(self._since, last_step_at)
        return quiet if quiet > self.limit_s else 0.0
