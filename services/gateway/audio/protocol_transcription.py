"""`/v1/audio/transcriptions`: the multipart form's fields as a validated request and its
`pb.TranscribeRequest`, and the answers built from the worker's events: `json`, `text`, `srt`,
`vtt`, `verbose_json`, and the `transcript.text.*` events of `stream=true`.

A form's values are strings; they are typed here (`temperature` "0.2", `stream` "true", arrays as
`timestamp_granularities[]`, the OpenAI SDK's spelling). Unknown fields are refused, naming them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.protocol_common.validation import Bool, Float, Str, WireModel, invalid, parse_body

DEFAULT_MAX_AUDIO_BYTES = 25 * 2**20  # OpenAI's file limit
ARRAYS = {"timestamp_granularities", "include"}
TEXT_FORMATS = {"text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
                "vtt": "text/vtt; charset=utf-8"}


@dataclass
class UploadedFile:
    filename: str
    content: bytes


@dataclass
class TranscriptionForm:
    """A multipart form as the router read it: text fields (each a list: a name may repeat) and files."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, list[UploadedFile]] = field(default_factory=dict)


class TranscriptionRequest(WireModel):
    model: Str
    language: Str | None = None
    prompt: Str | None = None
    response_format: Literal["json", "text", "srt", "verbose_json", "vtt"] = "json"
    temperature: Float | None = Field(None, ge=0.0, le=1.0)
    timestamp_granularities: list[Literal["word", "segment"]] | None = None
    stream: Bool = False
    chunking_strategy: Literal["auto"] | None = None  # accepted: the engine windows the audio itself
    include: list[Literal["logprobs"]] | None = None

    @model_validator(mode="after")
    def _check(self) -> TranscriptionRequest:
        if self.timestamp_granularities and self.response_format != "verbose_json":
            raise invalid("timestamp_granularities", "timestamp_granularities needs response_format 'verbose_json'.")
        if self.stream and self.response_format not in ("json", "text"):
            raise invalid("stream", f"stream=true is not available with response_format '{self.response_format}'; "
                                    "use 'json' or 'text'.")
        if self.include:
            raise invalid("include", "This model does not return logprobs; leave 'include' out.")
        return self

    @property
    def words(self) -> bool:
        return "word" in (self.timestamp_granularities or ())


def parse_transcription_form(form: TranscriptionForm, max_file_bytes: int = DEFAULT_MAX_AUDIO_BYTES,
                             ) -> tuple[TranscriptionRequest, UploadedFile]:
    """The request and its file, or OpenAIError (400 naming the field, 413 for a file past the limit)."""
    files = form.files.get("file") or []
    if len(files) != 1:
        raise OpenAIError(400, "Exactly one audio file is required in the 'file' field.", param="file")
    other = sorted(set(form.files) - {"file"})
    if other:
        raise OpenAIError(400, f"Unrecognized file field: '{other[0]}'.", param=other[0], code="unknown_parameter")
    upload = files[0]
    if len(upload.content) > max_file_bytes:
        raise OpenAIError(413, f"The audio file is {len(upload.content)} bytes; the limit is {max_file_bytes} bytes.",
                          param="file", code="file_too_large")
    if not upload.content:
        raise OpenAIError(400, "The audio file is empty.", param="file")
    body: dict[str, Any] = {}
    for raw_name, values in form.fields.items():
        name = raw_name.removesuffix("[]")
        if name in ARRAYS:
            body.setdefault(name, []).extend(values)
            continue
        if len(values) != 1:
            raise OpenAIError(400, f"'{name}' was given {len(values)} times.", param=name)
        body[name] = _typed(name, values[0])
    return parse_body(TranscriptionRequest, body), upload


def _typed(name: str, value: str) -> Any:
    """A form string as the JSON value the field takes (left as is where it does not parse: the
    model's validation then names the field)."""
    if name == "temperature":
        try:
            return float(value)
        except ValueError:
            return value
    if name == "stream":
        return {"true": True, "false": False}.get(value.lower(), value)
    return value


def to_transcribe_request(req: TranscriptionRequest, upload: UploadedFile, *, request_id: str) -> pb.TranscribeRequest:
    return pb.TranscribeRequest(request_id=request_id, model=req.model, audio=upload.content,
                                filename=upload.filename, language=req.language or "", prompt=req.prompt or "",
                                temperature=req.temperature, word_timestamps=req.words)


# ---- answers -----------------------------------------------------------------------------------

@dataclass
class Transcript:
    """What the worker sent: its info, the segments in order."""

    info: pb.TranscriptInfo = field(default_factory=pb.TranscriptInfo)
    segments: list[pb.TranscriptSegment] = field(default_factory=list)
    duration_s: float = 0.0

    def add(self, event: pb.TranscribeEvent) -> pb.TranscriptSegment | None:
        kind = event.WhichOneof("event")
        if kind == "info":
            self.info, self.duration_s = event.info, event.info.duration_s
        elif kind == "segment":
            self.segments.append(event.segment)
            return event.segment
        elif kind == "done":
            self.duration_s = event.done.duration_s or self.duration_s
        return None

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()


def usage(t: Transcript) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(t.duration_s)}


def answer(req: TranscriptionRequest, t: Transcript) -> dict[str, Any] | tuple[str, str]:
    """The JSON object, or (text, media type) for text, srt and vtt."""
    if req.response_format == "json":
        return {"text": t.text, "usage": usage(t)}
    if req.response_format == "verbose_json":
        out: dict[str, Any] = {"task": "transcribe", "language": t.info.language, "duration": t.duration_s,
                               "text": t.text}
        if req.timestamp_granularities is None or "segment" in req.timestamp_granularities:
            out["segments"] = [segment_object(s) for s in t.segments]
        if req.words:
            out["words"] = [{"word": w.word, "start": w.start, "end": w.end} for s in t.segments for w in s.words]
        out["usage"] = usage(t)
        return out
    if req.response_format == "text":
        return t.text + "\n", TEXT_FORMATS["text"]
    return subtitles(t.segments, vtt=req.response_format == "vtt"), TEXT_FORMATS[req.response_format]


def segment_object(s: pb.TranscriptSegment) -> dict[str, Any]:
    return {"id": s.id, "seek": int(s.start * 100), "start": s.start, "end": s.end, "text": s.text,
            "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}


def timestamp(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def subtitles(segments: list[pb.TranscriptSegment], *, vtt: bool) -> str:
    """SubRip (numbered cues, `,` before milliseconds) or WebVTT (a header, `.`)."""
    sep = "." if vtt else ","
    cues = [("" if vtt else f"{i}\n") + f"{timestamp(s.start, sep)} --> {timestamp(s.end, sep)}\n{s.text.strip()}\n"
            for i, s in enumerate(segments, 1)]
    return ("WEBVTT\n\n" if vtt else "") + "\n".join(cues)


def text_delta(segment: pb.TranscriptSegment, first: bool) -> dict[str, Any]:
    """`stream=true`: a segment's text (the first one without its leading space)."""
    return {"type": "transcript.text.delta", "delta": segment.text.lstrip() if first else segment.text}


def text_done(t: Transcript) -> dict[str, Any]:
    return {"type": "transcript.text.done", "text": t.text}
