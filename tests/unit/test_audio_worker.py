"""The worker's audio side against OpenAI's contract: raw `pcm` at 24 kHz whatever the voice's rate;
speech encoded off the worker's event loop; an upload longer than the limit refused without
decoding it whole (the real PyAV decoder, a stand-in for the Whisper model); undecodable or empty
uploads refused naming `file`."""

from __future__ import annotations

import io
import threading
import tracemalloc
import wave
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.errors import ServiceError
from services.worker import audio_encoding
from services.worker.audio_encoding import Encoder
from services.worker.engine import TranscribeOptions
from tests.engine_double import AudioDouble, serve_worker

pytestmark = pytest.mark.timeout(60)


def wav(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(int(rate * seconds) * 2))
    return out.getvalue()


def tone(rate: int, seconds: float, hz: float = 440.0) -> bytes:
    t = np.arange(int(rate * seconds))
    return (np.sin(2 * np.pi * hz * t / rate) * 8000).astype("<i2").tobytes()


def test_pcm_is_24khz_as_openai_sends_it():
    enc = Encoder(pb.AUDIO_FORMAT_PCM, 22050)  # Piper's usual rate
    assert enc.output_rate == 24_000
    audio = tone(22050, 1.0)
    out = enc.encode(audio[:22050]) + enc.encode(audio[22050:]) + enc.finish()
    samples = np.frombuffer(out, dtype="<i2")
    assert len(samples) == pytest.approx(24_000, abs=32)  # one second at 24 kHz
    spectrum = np.abs(np.fft.rfft(samples))
    assert np.argmax(spectrum) * 24_000 / len(samples) == pytest.approx(440, abs=2)  # the same pitch
    same = Encoder(pb.AUDIO_FORMAT_PCM, 24_000)  # already 24 kHz: the bytes as they are
    assert same.encode(b"ab") + same.finish() == b"ab"


async def test_speech_is_encoded_off_the_event_loop(monkeypatch):
    loop_thread = threading.get_ident()
    threads: list[int] = []
    encode = Encoder.encode

    def recording(self: Encoder, pcm: bytes) -> bytes:
        threads.append(threading.get_ident())
        return encode(self, pcm)
    monkeypatch.setattr(audio_encoding.Encoder, "encode", recording)
    worker = await serve_worker(AudioDouble(), name="tts")
    try:
        async with grpc.aio.insecure_channel(worker.address) as channel:
            call = worker_pb2_grpc.WorkerStub(channel).Synthesize(
                pb.SynthesizeRequest(request_id="r", model="tts", input="A. B.", format=pb.AUDIO_FORMAT_MP3))
            events = [e.WhichOneof("event") async for e in call]
    finally:
        await worker.server.stop(0)
    assert events[0] == "start" and events[-1] == "done" and "audio" in events
    assert len(threads) == 2 and loop_thread not in threads  # FFmpeg's work never on the worker's loop


class Model:
    """Whisper's stand-in: what it was asked to transcribe."""

    def __init__(self) -> None:
        self.heard: list[Any] = []
        self.model = SimpleNamespace(is_multilingual=True)

    def transcribe(self, samples: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.heard.append(samples)
        info = SimpleNamespace(language="en", language_probability=1.0, duration=len(samples) / 16_000)
        return (s for s in ()), info  # faster-whisper's segments: a generator


async def transcribe(audio: bytes, max_audio_s: float = 60.0) -> tuple[Model, list[Any]]:
    from services.worker.whisper_engine import WhisperEngine

    model = Model()
    engine = WhisperEngine(model, "stt", {})
    engine.max_audio_s = max_audio_s
    items = [item async for item in engine.transcribe(audio, TranscribeOptions(), "r")]
    assert engine.stats().running_requests == 0
    return model, items


async def test_audio_past_the_limit_is_refused_without_decoding_it_whole():
    pytest.importorskip("faster_whisper")
    audio = wav(600)  # ten minutes: 77 MB as 16 kHz samples (int16 and float32), were it decoded whole
    tracemalloc.start()
    try:
        with pytest.raises(ServiceError) as e:
            await transcribe(audio, max_audio_s=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.field_violations[0][0] == "file"
    assert "10 s" in e.value.message
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB held to refuse it"


async def test_uploads_decoded_or_refused_naming_file():
    pytest.importorskip("faster_whisper")
    model, items = await transcribe(wav(2.0, rate=44100))
    assert len(model.heard[0]) == 32_000 and items[0].duration_s == 2.0  # resampled to Whisper's 16 kHz
    for bad in (b"this is no audio" * 10, wav(2.0)[:20], wav(0), wav(0.05)):  # not audio; none or too short
        with pytest.raises(ServiceError) as e:
            await transcribe(bad)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.field_violations[0][0] == "file"
