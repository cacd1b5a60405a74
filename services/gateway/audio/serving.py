"""`POST /v1/audio/speech` and `POST /v1/audio/transcriptions`: the request, its worker call
(Synthesize / Transcribe, opened by `generation.open_audio`), the answer.

Speech is always streamed: the audio bytes as the worker encodes them (or, `stream_format: "sse"`,
as `speech.audio.delta` events). Transcription answers once the last segment is in, or streams
`transcript.text.delta` events (`stream=true`). However an answer ends (done, the client gone before
or during it), the worker call is cancelled and the engine stops before its next sentence/segment.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mship.common.v1 import common_pb2
from services.common.infer import InferStream, UpstreamError
from services.common.routes import RouteTable
from services.gateway.admission.admission import Admission
from services.gateway.audio.protocol import (
    SAMPLE_RATE_HEADER,
    SpeechRequest,
    audio_delta,
    audio_done,
    media_type,
    parse_speech_request,
    to_synthesize_request,
)
from services.gateway.audio.protocol_transcription import (
    DEFAULT_MAX_AUDIO_BYTES,
    Transcript,
    TranscriptionForm,
    TranscriptionRequest,
    answer,
    parse_transcription_form,
    text_delta,
    text_done,
    to_transcribe_request,
)
from services.gateway.edge.answer import Guard, unguarded
from services.gateway.edge.sse import sse_event
from services.gateway.generation import check_routed, open_audio, stream_failure
from services.gateway.identity import Caller
from services.gateway.protocol_common.outputs import new_id

log = logging.getLogger(__name__)


@dataclass
class AudioStream:
    """Audio bytes to send as they come, their media type and headers, and what to release when
    sending ends."""

    stream: InferStream
    media_type: str
    headers: dict[str, str]

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for event in self.stream:
                if event.WhichOneof("event") == "audio":
                    yield event.audio
        except UpstreamError as e:  # the response has begun: it can only end short
            log.warning("speech stream broke: %s", e.details.message)
        finally:
            self.release()

    def release(self) -> None:
        self.stream.close()


@dataclass
class TextAnswer:
    """A plain-text answer (`text`, `srt`, `vtt`)."""

    text: str
    media_type: str


class _EventStream:
    """Worker events -> server-sent events (the `EventStream` the edge sends)."""

    def __init__(self, stream: InferStream, frames: AsyncIterator[bytes]) -> None:
        self.stream, self._frames = stream, frames

    def frames(self) -> AsyncIterator[bytes]:
        return self._frames

    def release(self) -> None:
        self.stream.close()


class SpeechServing:
    def __init__(self, table: RouteTable, timeout_s: float | None = None, admission: Admission | None = None) -> None:
        self.table, self.timeout_s = table, timeout_s
        self.admission = admission or Admission(table)

    async def create(self, body: bytes, caller: Caller, guard: Guard = unguarded) -> AudioStream | _EventStream:
        req = parse_speech_request(body)
        check_routed(self.table, req.model, common_pb2.USECASE_SPEECH)
        # A voice has no tokens: the request counts for requests_per_minute (and its text, briefly, for
        # tokens_per_minute: the reservation is given back at once).
        ticket = await self.admission.admit(caller, req.model, prompt_bytes=len(req.input.encode()), max_tokens=0)
        ticket.settle(0)
        request = to_synthesize_request(req, request_id=new_id("speech"))
        stream: InferStream = await guard(open_audio(self.table, req.model, "Synthesize", request, input_param="input",
                                                     timeout_s=self.timeout_s, identity=caller.identity))
        start = stream.last.start if stream.last is not None else None
        if req.stream_format == "sse":
            return _EventStream(stream, self._sse(stream, req))
        headers = {SAMPLE_RATE_HEADER: str(start.sample_rate)} if start is not None else {}
        return AudioStream(stream, media_type(start) if start is not None else "application/octet-stream", headers)

    @staticmethod
    async def _sse(stream: InferStream, req: SpeechRequest) -> AsyncIterator[bytes]:
        try:
            async for event in stream:
                if event.WhichOneof("event") == "audio":
                    yield sse_event(audio_delta(event.audio))
        except UpstreamError as e:  # the events have begun: an `error` event ends them, as transcriptions do
            log.warning("speech stream broke: %s", e.details.message)
            yield sse_event({"type": "error", "error": stream_failure(e, req.model, "input").body()["error"]})
            return
        finally:
            stream.close()
        yield sse_event(audio_done(req))


class TranscriptionServing:
    def __init__(self, table: RouteTable, timeout_s: float | None = None, admission: Admission | None = None,
                 max_file_bytes: int = DEFAULT_MAX_AUDIO_BYTES) -> None:
        self.table, self.timeout_s, self.max_file_bytes = table, timeout_s, max_file_bytes
        self.admission = admission or Admission(table)

    async def create(self, form: TranscriptionForm, caller: Caller,
                     guard: Guard = unguarded) -> dict[str, Any] | TextAnswer | _EventStream:
        req, upload = parse_transcription_form(form, self.max_file_bytes)
        check_routed(self.table, req.model, common_pb2.USECASE_TRANSCRIPTION)
        ticket = await self.admission.admit(caller, req.model, prompt_bytes=len((req.prompt or "").encode()),
                                            max_tokens=0)  # audio is no prompt text: requests_per_minute counts
        ticket.settle(0)
        request = to_transcribe_request(req, upload, request_id=new_id("transcription"))
        stream: InferStream = await guard(open_audio(self.table, req.model, "Transcribe", request, input_param="file",
                                                     timeout_s=self.timeout_s, identity=caller.identity))
        if req.stream:
            return _EventStream(stream, self._sse(stream))
        try:
            transcript = await guard(self._collect(stream))
        finally:
            stream.close()
        result = answer(req, transcript)
        return result if isinstance(result, dict) else TextAnswer(*result)

    async def _collect(self, stream: InferStream) -> Transcript:
        transcript = Transcript()
        try:
            async for event in stream:
                transcript.add(event)
        except UpstreamError as e:
            raise stream_failure(e, None, "file") from e
        return transcript

    @staticmethod
    async def _sse(stream: InferStream) -> AsyncIterator[bytes]:
        transcript = Transcript()
        try:
            async for event in stream:
                segment = transcript.add(event)
                if segment is not None:
                    yield sse_event(text_delta(segment, first=len(transcript.segments) == 1))
        except UpstreamError as e:
            yield sse_event({"type": "error", "error": stream_failure(e, None, "file").body()["error"]})
            return
        finally:
            stream.close()
        yield sse_event(text_done(transcript))


__all__ = ["AudioStream", "SpeechServing", "TextAnswer", "TranscriptionRequest", "TranscriptionServing"]
