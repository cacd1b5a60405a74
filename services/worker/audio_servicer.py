"""The worker's audio calls, `Synthesize` and `Transcribe` (a part of `WorkerServicer`): validated,
admitted through the same backpressure gate as Infer, streamed as the engine produces (encoded in a
thread: FFmpeg's work never blocks the worker's event loop), stopped when the call is cancelled
(the handler's cancellation closes the engine's iterator: no next sentence or segment) or when
`Cancel` names the request. Each wait for the engine's next sentence or segment is watched like an
Infer step (services/worker/stall_watch.py): a speech engine that hangs fails the replica's health.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from mship.worker.v1 import worker_pb2 as pb
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.worker import metrics
from services.worker.audio_encoding import Encoder
from services.worker.engine import Engine, TranscribeOptions, TranscriptInfo, TranscriptSegment
from services.worker.inflight import InflightRequests

if TYPE_CHECKING:
    from services.worker.host import ModelHost
    from services.worker.request_gate import RequestGate

MAX_SPEECH_INPUT_CHARS = 4096  # OpenAI's limit of /v1/audio/speech input


class AudioCalls:
    """Synthesize / Transcribe; mixed into WorkerServicer (its engine lookup, gate and in-flight set)."""

    gate: RequestGate
    inflight: InflightRequests
    host: ModelHost

    if TYPE_CHECKING:  # WorkerServicer's
        def _engine_for(self, model: str) -> Engine: ...
        async def _admit(self, request_id: str) -> asyncio.Event: ...
        async def _engine_failure(self, engine: Engine, request_id: str, e: Exception) -> ServiceError: ...

    def _audio_engine(self, model: str, speech: bool) -> Engine:
        engine = self._engine_for(model)
        if not (engine.supports_speech if speech else engine.supports_transcription):
            what = "speech (text to audio)" if speech else "transcription (audio to text)"
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                               f"model {model!r} does not serve {what}", field_violations=[("model", what)])
        return engine

    @contextlib.asynccontextmanager
    async def _running(self, model: str, request_id: str) -> AsyncIterator[None]:
        """In flight (Cancel by id), behind the gate, counted by outcome however it ends."""
        admitted = await self._admit(request_id)
        outcome = "cancelled"  # unless it ends otherwise: the caller went away (or Cancel)
        try:
            async with self.gate.admitted(request_id):
                yield
            outcome = "finished"
        except ServiceError as e:
            outcome = "refused" if e.reason == Reason.OVERLOADED else (
                "cancelled" if e.code == grpc.StatusCode.CANCELLED else "failed")
            raise
        finally:
            self.inflight.release(request_id, admitted)
            metrics.REQUESTS.labels(model, outcome).inc()

    async def Synthesize(self, request: pb.SynthesizeRequest, context) -> AsyncIterator[pb.SynthesizeEvent]:
        engine = self._audio_engine(request.model, speech=True)
        text = request.input
        if not text.strip():
            raise invalid_parameter("input", "input must not be empty")
        if len(text) > MAX_SPEECH_INPUT_CHARS:
            raise invalid_parameter("input", f"input is {len(text)} characters; at most {MAX_SPEECH_INPUT_CHARS}")
        encoder = Encoder(request.format, engine.sample_rate)  # an unavailable format: refused here
        speed = request.speed if request.HasField("speed") else None
        request_id = request.request_id or uuid.uuid4().hex
        samples = 0
        async with self._running(request.model, request_id):
            chunks, watch = engine.synthesize(text, request.voice, speed, request_id), self.host.watch
            try:
                started = False
                while (pcm := await watch.next_step(chunks)) is not None:
                    if not started:  # after the first sentence: a refused voice or speed never sent a start
                        started = True
                        yield pb.SynthesizeEvent(start=pb.AudioStart(
                            format=encoder.format, sample_rate=encoder.output_rate, channels=1))
                    samples += len(pcm) // 2
                    data = await asyncio.to_thread(encoder.encode, pcm)  # FFmpeg's work: off the event loop
                    if data:
                        yield pb.SynthesizeEvent(audio=data)
                if not started:
                    raise invalid_parameter("input", "the input has nothing to speak")
                tail = await asyncio.to_thread(encoder.finish)
                if tail:
                    yield pb.SynthesizeEvent(audio=tail)
            except ServiceError:
                raise
            except Exception as e:
                raise await self._engine_failure(engine, request_id, e) from e
            finally:
                await chunks.aclose()  # stops the engine (no next sentence) however this ends
                await asyncio.to_thread(encoder.close)  # once an encode still in its thread is done
            yield pb.SynthesizeEvent(done=pb.SynthesizeDone(audio_seconds=samples / engine.sample_rate,
                                                            input_characters=len(text)))

    async def Transcribe(self, request: pb.TranscribeRequest, context) -> AsyncIterator[pb.TranscribeEvent]:
        engine = self._audio_engine(request.model, speech=False)
        if not request.audio:
            raise invalid_parameter("file", "the audio file is empty")
        options = TranscribeOptions(language=request.language or None, prompt=request.prompt or None,
                                    temperature=request.temperature if request.HasField("temperature") else None,
                                    word_timestamps=request.word_timestamps)
        request_id = request.request_id or uuid.uuid4().hex
        duration = 0.0
        async with self._running(request.model, request_id):
            items, watch = engine.transcribe(request.audio, options, request_id), self.host.watch
            try:
                while (item := await watch.next_step(items)) is not None:
                    if isinstance(item, TranscriptInfo):
                        duration = item.duration_s
                        yield pb.TranscribeEvent(info=pb.TranscriptInfo(
                            language=item.language, language_probability=item.language_probability,
                            duration_s=item.duration_s))
                    elif isinstance(item, TranscriptSegment):
                        yield pb.TranscribeEvent(segment=_segment(item))
            except ServiceError:
                raise
            except Exception as e:
                raise await self._engine_failure(engine, request_id, e) from e
            finally:
                await items.aclose()  # stops decoding (no next window) however this ends
            yield pb.TranscribeEvent(done=pb.TranscribeDone(duration_s=duration))


def _segment(s: TranscriptSegment) -> pb.TranscriptSegment:
    return pb.TranscriptSegment(
        id=s.id, start=s.start, end=s.end, text=s.text, tokens=s.tokens, temperature=s.temperature,
        avg_logprob=s.avg_logprob, compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob,
        words=[pb.TranscriptWord(start=w.start, end=w.end, word=w.word, probability=w.probability)
               for w in s.words])
