"""`/v1/audio/speech`: the request's wire model and its `pb.SynthesizeRequest`, the media type of
each audio format, and the `speech.audio.*` events of `stream_format: "sse"`.

The audio itself is encoded by the worker (it has the encoders); the edge sends its bytes as they
come. `pcm` is raw signed 16-bit little-endian mono at 24 kHz, as OpenAI's (the worker resamples
the voice; `x-mship-sample-rate` says the rate); `wav` is streamed, so its size fields say
"unknown" (0xFFFFFFFF).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import Field, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.validation import Float, Str, WireModel, invalid, parse_body

MAX_INPUT_CHARS = 4096  # OpenAI's limit
FORMATS = {"mp3": pb.AUDIO_FORMAT_MP3, "opus": pb.AUDIO_FORMAT_OPUS, "aac": pb.AUDIO_FORMAT_AAC,
           "flac": pb.AUDIO_FORMAT_FLAC, "wav": pb.AUDIO_FORMAT_WAV, "pcm": pb.AUDIO_FORMAT_PCM}
MEDIA_TYPES = {pb.AUDIO_FORMAT_MP3: "audio/mpeg", pb.AUDIO_FORMAT_OPUS: "audio/ogg", pb.AUDIO_FORMAT_AAC: "audio/aac",
               pb.AUDIO_FORMAT_FLAC: "audio/flac", pb.AUDIO_FORMAT_WAV: "audio/wav", pb.AUDIO_FORMAT_PCM: "audio/pcm"}
SAMPLE_RATE_HEADER = "x-mship-sample-rate"


class SpeechRequest(WireModel):
    model: Str
    input: Str = Field(max_length=MAX_INPUT_CHARS)
    voice: Str | dict[str, Any]
    instructions: Str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"  # OpenAI's default
    speed: Float | None = Field(None, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"

    @model_validator(mode="after")
    def _check(self) -> SpeechRequest:
        if not self.input.strip():
            raise invalid("input", "Invalid 'input': must not be empty.", self.input)
        if isinstance(self.voice, dict):  # OpenAI's custom voice object: {"id": "voice_..."}
            voice_id = self.voice.get("id")
            if set(self.voice) != {"id"} or not isinstance(voice_id, str):
                raise invalid("voice", "Invalid 'voice': expected a voice name or {\"id\": \"...\"}.", self.voice)
        if not self.voice_name.strip():
            raise invalid("voice", "Invalid 'voice': must not be empty; give a voice name such as 'alloy'.",
                          self.voice)
        if self.instructions:  # Piper voices speak the text as it is written
            raise invalid("instructions", "This model does not take 'instructions'; leave it out.", self.instructions)
        return self

    @property
    def voice_name(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice["id"]


def parse_speech_request(body: bytes | str | dict[str, Any]) -> SpeechRequest:
    """The request, or OpenAIError 400 (bad JSON, unknown field, wrong type, bad value)."""
    return parse_body(SpeechRequest, body)


def to_synthesize_request(req: SpeechRequest, *, request_id: str) -> pb.SynthesizeRequest:
    return pb.SynthesizeRequest(request_id=request_id, model=req.model, input=req.input, voice=req.voice_name,
                                speed=req.speed, format=FORMATS[req.response_format])


def media_type(start: pb.AudioStart) -> str:
    return MEDIA_TYPES.get(start.format, "application/octet-stream")


def audio_delta(data: bytes) -> dict[str, Any]:
    """`stream_format: "sse"`: the next bytes of the audio."""
    return {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}


def audio_done(req: SpeechRequest) -> dict[str, Any]:
    """`stream_format: "sse"`: the end (usage in characters: a voice has no tokens)."""
    n = len(req.input)
    return {"type": "speech.audio.done", "usage": {"input_tokens": n, "output_tokens": 0, "total_tokens": n}}
