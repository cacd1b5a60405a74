"""What the audio engines (piper, faster_whisper) share: their blocking inference runs in a thread
of its own per request, never on the worker's event loop, and stops between two units of work (a
sentence, a segment) once the request is stopped: its call cancelled (the consumer closes the
iterator) or `abort` naming it. The engine's own counters (running requests, audio seconds) are
what GetLoad reports, so "the engine stopped" can be observed from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import grpc

from services.common.errors import Reason, ServiceError
from services.worker.engine import Engine, EngineStats, Prompt, RenderRequest, StepOutput
from services.worker.sampling import Sampling

log = logging.getLogger(__name__)
T = TypeVar("T")
_ITEM, _ERROR, _END = "item", "error", "end"


def engine_threads(num_cpus: float) -> int:
    """Inference threads for a CPU share: one per whole CPU, at least one (a fractional share, e.g.
    0.25 beside an LLM engine on the same node, gets one thread, not the node's every core)."""
    return max(1, int(num_cpus + 0.5)) if num_cpus > 0 else 1


class Stopped(Exception):
    """The request was stopped (`abort`) before its work was done."""


class AudioEngine(Engine):
    """An engine whose work is a blocking iterator (one item per sentence or segment)."""

    max_model_len = 0

    def __init__(self) -> None:
        self._stops: dict[str, threading.Event] = {}
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self._running = 0  # threads still working (they decrement it themselves as they end)
        self.audio_seconds_total = 0.0
        self.requests_total = 0
        self._dead = False

    # ---- the thread runner ------------------------------------------------------------------------
    async def run_blocking(self, request_id: str, work: Callable[[threading.Event], Iterator[T]]) -> AsyncIterator[T]:
        """Iterate `work(stop)` in a thread, item by item. Leaving this iterator early (the call was
        cancelled) sets `stop`; the thread checks it before each next item and closes `work`'s
        iterator (a lazy generator: no further inference). `abort(request_id)` ends it with CANCELLED."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()
        with self._lock:
            self._stops[request_id] = stop
            self._running += 1
            self.requests_total += 1

        def put(kind: str, value: Any = None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under us (shutdown): nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        def run() -> None:
            items: Iterator[T] | None = None
            try:
                items = work(stop)
                while not stop.is_set():
                    try:
                        item = next(items)
                    except StopIteration:
                        break
                    put(_ITEM, item)
                if stop.is_set():
                    put(_ERROR, Stopped())
            except BaseException as e:  # reported to the caller, never lost in the thread
                put(_ERROR, e)
            finally:
                close = getattr(items, "close", None)
                if callable(close):
                    with contextlib.suppress(Exception):
                        close()
                with self._lock:
                    self._running -= 1
                put(_END)

        threading.Thread(target=run, name=f"audio-{request_id[:16]}", daemon=True).start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == _ITEM:
                    yield value
                elif kind == _ERROR:
                    if isinstance(value, Stopped) and request_id in self._aborted:
                        raise ServiceError(grpc.StatusCode.CANCELLED, Reason.ERROR_REASON_UNSPECIFIED,
                                           "the request was cancelled")
                    if not isinstance(value, Stopped):
                        raise value
                else:
                    return
        finally:
            stop.set()  # however this ends: the thread does no more work
            with self._lock:
                self._stops.pop(request_id, None)
                self._aborted.discard(request_id)

    def count_audio(self, seconds: float) -> None:
        with self._lock:
            self.audio_seconds_total += seconds

    # ---- Engine -----------------------------------------------------------------------------------
    async def abort(self, request_ids: list[str]) -> None:
        with self._lock:
            for rid in request_ids:
                stop = self._stops.get(rid)
                if stop is not None:
                    self._aborted.add(rid)
                    stop.set()

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(running_requests=self._running, audio_seconds_total=self.audio_seconds_total)

    @property
    def errored(self) -> bool:
        return self._dead

    async def shutdown(self) -> None:
        with self._lock:
            for stop in self._stops.values():
                stop.set()

    async def render(self, req: RenderRequest) -> Prompt:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                           "this model serves audio, not text generation", field_violations=[("model", "audio model")])

    def generate(self, prompt: Prompt, sampling: Sampling, request_id: str,
                 priority: int = 0) -> AsyncIterator[StepOutput]:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                           "this model serves audio, not text generation", field_violations=[("model", "audio model")])
