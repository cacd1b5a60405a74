"""ModelHost: the one model a worker process serves, through its load lifecycle.

resolve the reference (build a builtin model on first use) -> start the engine -> warm it with a
real forward pass -> READY. Health says SERVING only from READY on, and NOT_SERVING again when
the engine dies. Progress is recorded in an EventLog, so a late `Load` caller still sees the whole
history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from grpc_health.v1 import health, health_pb2

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2
from services.common.event_log import EventLog
from services.common.gc_heap import freeze_startup_heap
from services.worker.engine import Engine, RenderRequest, TranscribeOptions
from services.worker.metrics import ENGINE_DEATHS
from services.worker.sampling import Sampling
from services.worker.stall_watch import DEFAULT_STALL_TIMEOUT_S, StallWatch

log = logging.getLogger(__name__)
SERVICE_NAME = "mship.worker.v1.Worker"
Phase = worker_pb2.LoadPhase
# Held while the model loads and warms: in the platform, the coordinator's per-node load lease.
LoadGate = Callable[[], AbstractAsyncContextManager[None]]
SETTLED = (Phase.LOAD_PHASE_READY, Phase.LOAD_PHASE_FAILED)  # where a load's progress ends


async def start_engine(spec: common_pb2.ModelSpec, model_path: str) -> Engine:
    """Start the engine the spec's loader names."""
    if spec.loader in (common_pb2.LOADER_VLLM, common_pb2.LOADER_UNSPECIFIED):
        from google.protobuf.json_format import MessageToDict

        from services.worker.vllm_engine import VllmEngine, engine_args_for
        overrides = MessageToDict(spec.engine_args) if spec.HasField("engine_args") else None
        return await VllmEngine.start(lambda: engine_args_for(
            model_path, spec.name, max_model_len=spec.max_model_len, max_num_seqs=spec.max_num_seqs,
            embed=spec.usecase == common_pb2.USECASE_EMBED, num_gpus=spec.num_gpus, overrides=overrides))
    if spec.loader == common_pb2.LOADER_LLAMA_CPP:
        from services.worker.llama_cpp_engine import LlamaCppEngine

        return await LlamaCppEngine.start(spec, model_path)
    if spec.loader == common_pb2.LOADER_PIPER:
        from services.worker.piper_engine import PiperEngine

        return await PiperEngine.start(spec, model_path)
    if spec.loader == common_pb2.LOADER_FASTER_WHISPER:
        from services.worker.whisper_engine import WhisperEngine

        return await WhisperEngine.start(spec, model_path)
    raise ValueError(f"loader {common_pb2.Loader.Name(spec.loader)} is not available in this worker")


def resolve_model(ref: str) -> str:
    """What vLLM loads: a directory (builtins built on first use) or a hub id."""
    from services.worker.builtin import resolve_model_ref

    # A local path that is not there would reach the engine as a hub id and fail less clearly.
    if ref.startswith(("/", "./", "../", "~")) and not Path(ref).expanduser().exists():
        raise FileNotFoundError(f"model path {ref} does not exist on this node")
    return resolve_model_ref(ref)


class ModelHost:
    def __init__(self, health_servicer: health.aio.HealthServicer | None = None) -> None:
        self.spec: common_pb2.ModelSpec | None = None
        self.engine: Engine | None = None
        self.phase = Phase.LOAD_PHASE_UNSPECIFIED
        self.history: EventLog[worker_pb2.LoadProgress] = EventLog()
        self._health = health_servicer
        self._t0 = time.monotonic()
        self._task: asyncio.Task | None = None
        self.watch = StallWatch(0)  # until a load says otherwise

    @property
    def ready(self) -> bool:
        return self.phase == Phase.LOAD_PHASE_READY and self.engine is not None and not self.engine.errored

    @property
    def model_name(self) -> str:
        return self.spec.name if self.spec else ""

    def begin_load(self, spec: common_pb2.ModelSpec, gate: LoadGate | None = None) -> None:
        """Start loading `spec` in the background (once per process)."""
        if self.spec is not None:
            raise RuntimeError("this worker already serves a model")
        self.spec = spec
        self.watch = StallWatch(spec.stall_timeout_s if spec.HasField("stall_timeout_s") else DEFAULT_STALL_TIMEOUT_S)
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._load(spec, gate or contextlib.nullcontext))

    def load_seconds(self) -> float:
        """From the start of the load proper (the gate passed) to READY; 0 before READY."""
        at = {event.phase: event.at for event in self.history.events}
        if Phase.LOAD_PHASE_READY not in at or Phase.LOAD_PHASE_RESOLVING not in at:
            return 0.0
        return at[Phase.LOAD_PHASE_READY] - at[Phase.LOAD_PHASE_RESOLVING]

    async def wait_ready(self) -> None:
        async for _ in self.progress():
            pass
        if self.phase == Phase.LOAD_PHASE_FAILED:
            raise RuntimeError(self.history.events[-1].message)

    async def progress(self) -> AsyncIterator[worker_pb2.LoadProgress]:
        """Every progress event so far, then new ones until READY or FAILED."""
        # The log stays open after READY (the engine may still die: FAILED), so stop at the first
        # settled phase rather than at the log's end.
        async for event in self.history.follow():
            yield event
            if event.phase in SETTLED:
                return

    def _set(self, phase: int, message: str = "") -> None:
        self.phase = phase
        event = worker_pb2.LoadProgress(phase=phase, message=message, at=time.time(),
                                        elapsed_s=time.monotonic() - self._t0,
                                        max_model_len=self.engine.max_model_len if self.engine else 0)
        self.history.append(event)
        log.info("load %s: %s %s (%.1fs)", self.model_name, Phase.Name(phase), message, event.elapsed_s)

    async def _load(self, spec: common_pb2.ModelSpec, gate: LoadGate) -> None:
        try:
            async with gate():  # the memory spike of a load never overlaps another on this node
                self._set(Phase.LOAD_PHASE_RESOLVING, spec.model)
                # llama_cpp resolves its GGUF references itself (services/worker/gguf_models.py)
                path = (spec.model if spec.loader == common_pb2.LOADER_LLAMA_CPP
                        else await asyncio.to_thread(resolve_model, spec.model))
                self._set(Phase.LOAD_PHASE_LOADING, path)
                self.engine = await start_engine(spec, path)
                self._set(Phase.LOAD_PHASE_WARMING)
                await self._warm(self.engine)
                self._set(Phase.LOAD_PHASE_READY)
            freeze_startup_heap(f"worker {self.model_name}")  # before it serves: no long GC pause mid-stream
            await self._set_health(True)
        except Exception as e:  # reported through Load and health, never raised into the loop
            log.exception("loading %s failed", spec.model)
            self._set(Phase.LOAD_PHASE_FAILED, f"{type(e).__name__}: {e}")

    async def _warm(self, engine: Engine) -> None:
        """A real forward pass: readiness means the engine has produced a token."""
        if engine.supports_embeddings:
            await engine.embed(["warm up"], None)
            return
        if engine.supports_speech:
            async for _ in engine.synthesize("Warm up.", "", None, "warmup"):
                pass
            return
        if engine.supports_transcription:
            from services.worker.audio_encoding import wav_header

            silence = wav_header(16_000, 32_000) + bytes(32_000)  # one second
            async for _ in engine.transcribe(silence, TranscribeOptions(language="en"), "warmup"):
                pass
            return
        prompt = await engine.render(RenderRequest(prompt="warm up"))

        async def drain(request_id: str, max_tokens: int) -> None:
            sampling = Sampling(max_tokens=max_tokens, temperature=0.0, logprobs=1)
            async for _ in engine.generate(prompt, sampling, request_id):
                pass

        # With logprobs, once alone and then two at a time: vLLM builds its logprobs kernel with
        # torch.compile (a C++ build on CPU, seconds, far more on a cold cache) at the first batch
        # that asks for logprobs and again, shape-generic, at the next batch size. Done here, that
        # is load time; otherwise the first such request stalls every stream on the engine.
        await drain("warmup", 1)
        await asyncio.gather(drain("warmup-a", 4), drain("warmup-b", 4))

    async def _set_health(self, serving: bool) -> None:
        if self._health is None:
            return
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in ("", SERVICE_NAME):
            await self._health.set(service, status)

    async def check(self) -> bool:
        """Health probe: flips health to NOT_SERVING once the engine has died, or hung (a hung
        engine is killed first, so that its requests fail as they do when it crashes)."""
        engine = self.engine
        if engine is not None and self.phase == Phase.LOAD_PHASE_READY:
            if engine.errored:
                await self._lost("engine died")
            elif self.watch.quiet_for(engine.stats().last_step_at):
                if await engine.answers_probe():  # e.g. one long prompt, which shows no step
                    self.watch.progressed()
                elif self.phase == Phase.LOAD_PHASE_READY and (quiet := self.watch.quiet_for(
                        engine.stats().last_step_at)):  # (a check beside this one may have got here first)
                    log.error("the engine of %s showed no progress for %.0f s with requests in it (stall_timeout_s "
                              "%g): killing it; Serve replaces this replica", self.model_name, quiet,
                              self.watch.limit_s)
                    engine.kill()
                    await self._lost(f"engine hung: no progress for {quiet:.0f} s with requests in it")
        return self.ready

    @property
    def engine_lost(self) -> bool:
        """The engine died or hung after it was ready (not a load that failed)."""
        return self.engine is not None and (self.engine.errored or self.phase == Phase.LOAD_PHASE_FAILED)

    async def _lost(self, why: str) -> None:
        ENGINE_DEATHS.labels(self.model_name).inc()
        self._set(Phase.LOAD_PHASE_FAILED, why)
        await self._set_health(False)

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            # A load still under way: its own cleanup (the engine it is starting, the node's load
            # lease) must run before this returns, or the process may be gone before it does.
            self._task.cancel()
            await asyncio.wait({self._task})
        if self.engine is not None:
            await self.engine.shutdown()
