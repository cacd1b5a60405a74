"""The `faster_whisper` loader: Whisper speech to text in CTranslate2 form (faster-whisper) for
`usecase: transcription`.

The model is a CTranslate2 Whisper directory (`model.bin`, `config.json`, `tokenizer.json`,
`vocabulary.json`: what builtin:whisper-base builds). The uploaded file is decoded by PyAV (its
bundled FFmpeg: wav, mp3, flac, ogg, m4a, webm...) to 16 kHz mono, in the request's thread; audio
longer than `MSHIP_MAX_AUDIO_SECONDS` is refused once that much is decoded (the file is never held
whole). faster-whisper's segments are a lazy generator: each step decodes the next window, so a
stopped request decodes no further window. CTranslate2 gets the replica's CPU share as its thread
count (`num_cpus`, at least one thread).

engine_args: `compute_type` (default int8 on CPU), and transcription options passed as they are:
`beam_size` (default 5; 1 is greedy: faster, a little less accurate), `best_of`, `patience`,
`vad_filter`, `condition_on_previous_text`, `no_speech_threshold`, `compression_ratio_threshold`,
`log_prob_threshold`, `chunk_length`, `hallucination_silence_threshold`.
"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from mship.common.v1 import common_pb2
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.common.vocabulary import ENV_MAX_AUDIO_SECONDS
from services.worker.audio_engine import AudioEngine, engine_threads
from services.worker.engine import TranscribeOptions, TranscriptInfo, TranscriptSegment, TranscriptWord

log = logging.getLogger(__name__)
SAMPLE_RATE = 16_000  # what Whisper listens at
DEFAULT_MAX_AUDIO_SECONDS = 1500.0
MIN_AUDIO_SECONDS = 0.1  # OpenAI's shortest
DECODE_GROUP = 500_000  # samples at the file's own rate decoded before each resampling (as faster-whisper)
TRANSCRIBE_ARGS = {"beam_size", "best_of", "patience", "vad_filter", "condition_on_previous_text",
                   "no_speech_threshold", "compression_ratio_threshold", "log_prob_threshold", "chunk_length",
                   "hallucination_silence_threshold"}
MODEL_ARGS = {"compute_type"}


def max_audio_seconds() -> float:
    value = os.environ.get(ENV_MAX_AUDIO_SECONDS, "")
    try:
        return float(value) if value and float(value) > 0 else DEFAULT_MAX_AUDIO_SECONDS
    except ValueError:
        return DEFAULT_MAX_AUDIO_SECONDS


def split_engine_args(spec: common_pb2.ModelSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """engine_args as (model options, transcription options); an unknown key fails the load, named."""
    args = MessageToDict(spec.engine_args) if spec.HasField("engine_args") else {}
    unknown = sorted(set(args) - TRANSCRIBE_ARGS - MODEL_ARGS)
    if unknown:
        known = sorted(TRANSCRIBE_ARGS | MODEL_ARGS)
        raise ValueError(f"faster_whisper: unknown engine_args {unknown}; known: {known}")
    for key in ("beam_size", "best_of", "chunk_length"):
        if key in args:
            args[key] = int(args[key])
    return {k: v for k, v in args.items() if k in MODEL_ARGS}, {k: v for k, v in args.items() if k in TRANSCRIBE_ARGS}


class WhisperEngine(AudioEngine):
    supports_transcription = True

    def __init__(self, model: Any, name: str, transcribe_args: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.name = model, name
        self.transcribe_args = transcribe_args  # unset: faster-whisper's defaults (beam_size 5)
        self.max_audio_s = max_audio_seconds()

    @classmethod
    async def start(cls, spec: common_pb2.ModelSpec, model_path: str) -> WhisperEngine:
        from faster_whisper import WhisperModel

        model_args, transcribe_args = split_engine_args(spec)
        device = "cuda" if spec.num_gpus > 0 else "cpu"
        compute_type = model_args.get("compute_type", "int8" if device == "cpu" else "default")
        threads = engine_threads(spec.num_cpus)
        model = await asyncio.to_thread(WhisperModel, model_path, device=device, compute_type=compute_type,
                                        cpu_threads=threads, num_workers=1, local_files_only=True)
        log.info("faster-whisper %s loaded (%s, %s, %d thread(s))", model_path, device, compute_type, threads)
        return cls(model, spec.name, transcribe_args)

    def check_options(self, options: TranscribeOptions) -> None:
        from faster_whisper.tokenizer import _LANGUAGE_CODES

        if options.language and options.language not in _LANGUAGE_CODES:
            raise invalid_parameter("language", f"unknown language {options.language!r}: give an ISO-639-1 code "
                                                "such as 'en'")
        if options.language and options.language != "en" and not self.model.model.is_multilingual:
            raise invalid_parameter("language", "this model transcribes English only")
        if options.temperature is not None and not 0.0 <= options.temperature <= 1.0:
            raise invalid_parameter("temperature", "temperature must be between 0 and 1")

    async def transcribe(self, audio: bytes, options: TranscribeOptions,
                         request_id: str) -> AsyncIterator[TranscriptInfo | TranscriptSegment]:
        self.check_options(options)  # refusals before any engine work
        if not audio:
            raise invalid_parameter("file", "the audio file is empty")

        def work(stop: threading.Event) -> Iterator[TranscriptInfo | TranscriptSegment]:
            samples = decode(audio, self.max_audio_s, stop)  # refused as soon as it runs past the limit
            if stop.is_set():
                return
            if len(samples) < MIN_AUDIO_SECONDS * SAMPLE_RATE:  # OpenAI's audio_too_short
                raise invalid_parameter("file", f"the audio is {len(samples) / SAMPLE_RATE:.2f} s long; the "
                                                f"shortest this model transcribes is {MIN_AUDIO_SECONDS} s")
            kwargs = dict(self.transcribe_args)
            if options.temperature is not None:
                kwargs["temperature"] = options.temperature
            segments, info = self.model.transcribe(  # runs language detection (the first window) here
                samples, language=options.language or None, initial_prompt=options.prompt or None,
                word_timestamps=options.word_timestamps, **kwargs)
            yield TranscriptInfo(info.language, float(info.language_probability), float(info.duration))
            done = 0.0
            try:
                for s in segments:  # lazy: each step decodes the next window
                    self.count_audio(max(0.0, s.end - done))
                    done = max(done, s.end)
                    yield segment_of(s)
            finally:
                segments.close()

        async for item in self.run_blocking(request_id, work):
            yield item


def decode(audio: bytes, max_seconds: float = math.inf, stop: threading.Event | None = None) -> Any:
    """16 kHz mono float samples of an uploaded file, or INVALID_PARAMETER naming `file` (not audio,
    or longer than `max_seconds`). Decoded frame group by frame group (faster-whisper's own decoder
    keeps the whole file in memory first): a long file is refused once its first `max_seconds` are
    decoded, and a stopped request (`stop`) decodes no further."""
    import av
    import numpy as np

    limit = max_seconds * SAMPLE_RATE
    resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    parts: list[Any] = []
    count = 0
    try:
        with av.open(io.BytesIO(audio), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise invalid_parameter("file", "the file holds no audio track")
            for group in _frame_groups(container.decode(audio=0), stop):
                for out in resampler.resample(group):
                    parts.append(out.to_ndarray().reshape(-1))
                    count += parts[-1].shape[0]
                if count > limit:
                    raise invalid_parameter("file", f"the audio is longer than {max_seconds:.0f} s, the most this "
                                                    "model transcribes")
    except ServiceError:
        raise
    except Exception as e:  # PyAV's errors (not audio, truncated, no audio stream)
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_PARAMETER,
                           f"the file could not be decoded as audio ({type(e).__name__})",
                           field_violations=[("file", "not a decodable audio file")]) from e
    finally:
        del resampler
        gc.collect()  # PyAV's resampler holds FFmpeg memory until collected (faster-whisper#390)
    samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
    return samples.astype(np.float32) / 32768.0


def _frame_groups(frames: Iterator[Any], stop: threading.Event | None) -> Iterator[Any]:
    """The decodable frames in groups of about DECODE_GROUP samples, then None (the resampler's
    flush). A damaged frame inside a file is skipped, as faster-whisper does; a stopped request
    ends the groups early."""
    import av

    fifo = av.audio.fifo.AudioFifo()
    while stop is None or not stop.is_set():
        try:
            frame = next(frames)
        except StopIteration:
            break
        except av.error.InvalidDataError:
            continue
        frame.pts = None  # as faster-whisper does: no timestamp checks across the group
        fifo.write(frame)
        if fifo.samples >= DECODE_GROUP:
            yield fifo.read()
    if fifo.samples > 0:
        yield fifo.read()
    yield None


def segment_of(s: Any) -> TranscriptSegment:
    return TranscriptSegment(
        id=int(s.id), start=float(s.start), end=float(s.end), text=s.text, tokens=list(s.tokens),
        temperature=float(s.temperature or 0.0), avg_logprob=float(s.avg_logprob),
        compression_ratio=float(s.compression_ratio), no_speech_prob=float(s.no_speech_prob),
        words=[TranscriptWord(float(w.start), float(w.end), w.word, float(w.probability)) for w in s.words or []])
