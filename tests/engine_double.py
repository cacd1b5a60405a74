"""An in-process engine double behind the real `WorkerServicer` on a real grpc.aio server.

Shared by the servicer tests and the gateway edge tests: everything above the engine (validation,
admission, parsing, streaming, cancellation, the gRPC wire) is the real code.
"""

from __future__ import annotations

import asyncio
import math
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import invalid_parameter
from services.worker.audio_engine import AudioEngine
from services.worker.engine import (
    ChoiceDelta,
    Engine,
    EngineStats,
    Prompt,
    RenderRequest,
    StepOutput,
    TranscribeOptions,
    TranscriptInfo,
    TranscriptSegment,
    TranscriptWord,
)
from services.worker.host import SERVICE_NAME, ModelHost
from services.worker.request_gate import RequestGate
from services.worker.sampling import Sampling
from services.worker.server import worker_server
from services.worker.servicer import WorkerServicer


class ScriptedEngine(Engine):
    """Answers every prompt with `script`, one chunk per step (one token per word of the prompt).

    `hold` parks it before the last chunk, `first_hold` before the first; `fail` raises an engine
    error at the first step, `fail_at` at that step (after the earlier chunks went out).
    `started`, `renders` and `cancelled` record what it saw: request ids whose generation began,
    every render request, and request ids whose generation was cancelled (the servicer's handler
    cancelled, as when the gRPC call is cancelled) or closed before finishing; `samplings` the
    sampling of each generation (e.g. the structured output a test's script stands for).
    `prompt_tail` is how the rendered prompt text ends (a chat template that opens `<think>`).
    """

    def __init__(self, script: list[str], max_model_len: int = 64) -> None:
        self.script, self.max_model_len = script, max_model_len
        self.aborted: set[str] = set()
        self.hold = asyncio.Event()
        self.hold.set()
        self.first_hold = asyncio.Event()
        self.first_hold.set()
        self.fail = False
        self.fail_at: int | None = None
        self.started: list[str] = []
        self.renders: list[RenderRequest] = []
        self.cancelled: list[str] = []
        self.samplings: list[Sampling] = []
        self.prompt_tail = ""

    async def render(self, req: RenderRequest) -> Prompt:
        self.renders.append(req)
        words = " ".join(m["content"] for m in req.messages or []) if req.messages else (req.prompt or "")
        return Prompt(token_ids=list(range(len(words.split()))), engine_input=None, tail=self.prompt_tail)

    async def generate(self, prompt, sampling, request_id, priority=0) -> AsyncIterator[StepOutput]:
        self.started.append(request_id)
        self.samplings.append(sampling)
        finished = False
        try:
            await self.first_hold.wait()
            for i, chunk in enumerate(self.script):
                last = i == len(self.script) - 1
                if last:
                    await self.hold.wait()
                if request_id in self.aborted:
                    finished = True
                    self.aborted.discard(request_id)  # a request made again under its id runs
                    yield StepOutput([ChoiceDelta(0, "", 0, finish_reason="abort")], True, len(prompt.token_ids), 0)
                    return
                if self.fail or i == self.fail_at:
                    raise RuntimeError("engine exploded")
                finished = last
                yield StepOutput([ChoiceDelta(0, chunk, 1, finish_reason="stop" if last else None)], last,
                                 len(prompt.token_ids), 0)
                await asyncio.sleep(0)
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                self.cancelled.append(request_id)
            raise

    async def abort(self, request_ids):
        self.aborted.update(request_ids)
        self.hold.set()
        self.first_hold.set()

    def stats(self):
        return EngineStats()

    @property
    def errored(self):
        return False

    async def shutdown(self):
        pass


class AudioDouble(AudioEngine):
    """A voice and an ear on the real `AudioEngine` thread runner. `synthesize` speaks each sentence
    of the input (split at ".") as `SENTENCE_S` seconds of a tone; `transcribe` hears `segments`,
    one per unit of work. With `permits` set (a threading.Semaphore), each unit waits for a permit,
    so a test can hold the engine mid-work. `units` counts the units done, `heard` what each
    transcription received; the voice "nobody" is refused, like an unknown speaker."""

    supports_speech = True
    supports_transcription = True
    sample_rate = 8000
    SENTENCE_S = 0.25

    def __init__(self, segments: tuple[str, ...] = (" Hello", " world.")) -> None:
        super().__init__()
        self.segments = segments
        self.permits: threading.Semaphore | None = None
        self.units = 0
        self.heard: list[tuple[bytes, TranscribeOptions]] = []

    def _unit(self) -> None:
        if self.permits is not None and not self.permits.acquire(timeout=10):
            raise RuntimeError("no permit for the next unit")
        self.units += 1

    def tone(self) -> bytes:
        n = int(self.sample_rate * self.SENTENCE_S)
        return struct.pack(f"<{n}h", *(int(8000 * math.sin(i / 4)) for i in range(n)))

    async def synthesize(self, text, voice, speed, request_id) -> AsyncIterator[bytes]:
        if voice == "nobody":
            raise invalid_parameter("voice", "unknown voice 'nobody'")
        sentences = [s for s in text.split(".") if s.strip()]

        def work(stop: threading.Event) -> Iterator[bytes]:
            for _ in sentences:
                self._unit()
                self.count_audio(self.SENTENCE_S)
                yield self.tone()

        async for pcm in self.run_blocking(request_id, work):
            yield pcm

    async def transcribe(self, audio, options, request_id) -> AsyncIterator[TranscriptInfo | TranscriptSegment]:
        self.heard.append((audio, options))
        if options.language == "xx":
            raise invalid_parameter("language", "unknown language 'xx'")

        def work(stop: threading.Event) -> Iterator[TranscriptInfo | TranscriptSegment]:
            yield TranscriptInfo(options.language or "en", 0.99, len(self.segments) * 1.5)
            for i, text in enumerate(self.segments):
                self._unit()
                self.count_audio(1.5)
                words = [TranscriptWord(i * 1.5, i * 1.5 + 1.0, text.strip(), 0.9)] if options.word_timestamps else []
                yield TranscriptSegment(i + 1, i * 1.5, (i + 1) * 1.5, text, tokens=[50364 + i], words=words)

        async for item in self.run_blocking(request_id, work):
            yield item


@dataclass
class ServedWorker:
    server: grpc.aio.Server
    port: int
    servicer: WorkerServicer
    engine: ScriptedEngine

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def serve_worker(engine: ScriptedEngine, *, name: str = "m", ready: bool = True,
                       max_ongoing: int = 8, max_queued: int = 0, port: int = 0) -> ServedWorker:
    """Start a worker gRPC server on 127.0.0.1 (a free port, or `port`) serving `engine` as model
    `name`; stop it with `await worker.server.stop(0)`."""
    host = ModelHost()
    host.spec = common_pb2.ModelSpec(name=name, model="scripted")
    host.engine = engine
    host.phase = pb.LOAD_PHASE_READY if ready else pb.LOAD_PHASE_LOADING
    servicer = WorkerServicer(host, RequestGate(common_pb2.ReplicaLimits(max_ongoing_requests=max_ongoing,
                                                                          max_queued_requests=max_queued)))
    health_servicer = health.aio.HealthServicer()  # what a real worker answers (routers probe it)
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING if ready
                                  else health_pb2.HealthCheckResponse.NOT_SERVING)
    server = worker_server(servicer, health_servicer)  # the real construction: interceptors, options
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return ServedWorker(server, port, servicer, engine)
