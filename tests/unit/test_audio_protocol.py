"""The audio endpoints' pure parts: the speech request and its worker request, the transcription
form (typed from strings, arrays in the SDK's spelling), the answers (json, verbose_json, text, srt,
vtt); the worker's encoders (a streamed WAV, raw PCM, the compressed formats PyAV encodes); the
audio loaders in models.yaml and the node's capabilities."""

from __future__ import annotations

import io
import re
import types
import wave

import pytest

from clients.modelset import ConfigError, parse_models
from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.cluster import capabilities
from services.common.vocabulary import capability_resource
from services.gateway.audio.protocol import parse_speech_request, to_synthesize_request
from services.gateway.audio.protocol_transcription import (
    Transcript,
    TranscriptionForm,
    UploadedFile,
    answer,
    parse_transcription_form,
    subtitles,
    timestamp,
    to_transcribe_request,
)
from services.gateway.protocol_common.openai_error import OpenAIError
from services.worker.audio_encoding import Encoder, available_formats, wav_header
from services.worker.audio_engine import engine_threads

FILE = {"file": [UploadedFile("a.mp3", b"ID3...")]}


def test_speech_defaults_and_worker_request():
    req = parse_speech_request(b'{"model": "tts", "input": "Hi.", "voice": {"id": "joe"}, "speed": 1.5}')
    assert (req.response_format, req.stream_format, req.voice_name) == ("mp3", "audio", "joe")  # OpenAI's default
    out = to_synthesize_request(req, request_id="r")
    assert (out.model, out.input, out.voice, out.format) == ("tts", "Hi.", "joe", pb.AUDIO_FORMAT_MP3)
    assert out.HasField("speed") and out.speed == 1.5
    assert not to_synthesize_request(parse_speech_request({"model": "t", "input": "x", "voice": "a"}),
                                     request_id="r").HasField("speed")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "voice": "a"}, "model"),
    ({"model": "t", "input": "x"}, "voice"),
    ({"model": "t", "input": "x", "voice": {"name": "a"}}, "voice"),
    ({"model": "t", "input": "x", "voice": ""}, "voice"),
    ({"model": "t", "input": "x", "voice": "a", "speed": 0.1}, "speed"),
    ({"model": "t", "input": "x", "voice": "a", "stream_format": "chunks"}, "stream_format"),
])
def test_speech_refusals(body, param):
    with pytest.raises(OpenAIError) as e:
        parse_speech_request(body)
    assert (e.value.status, e.value.param) == (400, param)


def test_transcription_form_is_typed_like_the_sdk_sends_it():
    form = TranscriptionForm(fields={"model": ["stt"], "temperature": ["0.3"], "stream": ["false"],
                                     "timestamp_granularities[]": ["word", "segment"],
                                     "response_format": ["verbose_json"], "language": ["de"]}, files=FILE)
    req, upload = parse_transcription_form(form)
    assert (req.temperature, req.stream, req.timestamp_granularities, req.words) == (0.3, False, ["word", "segment"],
                                                                                     True)
    out = to_transcribe_request(req, upload, request_id="r")
    assert (out.audio, out.filename, out.language, out.word_timestamps) == (b"ID3...", "a.mp3", "de", True)
    assert out.temperature == pytest.approx(0.3)


@pytest.mark.parametrize(("fields", "files", "status", "param"), [
    ({"model": ["stt"]}, {"file": [UploadedFile("a", b"x"), UploadedFile("b", b"y")]}, 400, "file"),
    ({"model": ["stt"]}, {**FILE, "other": [UploadedFile("b", b"y")]}, 400, "other"),
    ({"model": ["stt", "stt2"]}, FILE, 400, "model"),
    ({"model": ["stt"], "stream": ["yes"]}, FILE, 400, "stream"),
    ({"model": ["stt"], "include[]": ["logprobs"]}, FILE, 400, "include"),
    ({"model": ["stt"], "chunking_strategy": ["server_vad"]}, FILE, 400, "chunking_strategy"),
    ({"model": ["stt"]}, {"file": [UploadedFile("a", bytes(11))]}, 413, "file"),
])
def test_transcription_form_refusals(fields, files, status, param):
    with pytest.raises(OpenAIError) as e:
        parse_transcription_form(TranscriptionForm(fields=fields, files=files), max_file_bytes=10)
    assert (e.value.status, e.value.param) == (status, param)


def transcript() -> Transcript:
    t = Transcript()
    t.add(pb.TranscribeEvent(info=pb.TranscriptInfo(language="en", duration_s=62.5)))
    t.add(pb.TranscribeEvent(segment=pb.TranscriptSegment(id=1, start=0, end=2.25, text=" Hello.", tokens=[1])))
    t.add(pb.TranscribeEvent(segment=pb.TranscriptSegment(id=2, start=61.0, end=3725.5, text=" Bye.")))
    t.add(pb.TranscribeEvent(done=pb.TranscribeDone(duration_s=62.5)))
    return t


def test_answers():
    req, _ = parse_transcription_form(TranscriptionForm(fields={"model": ["m"]}, files=FILE))
    assert answer(req, transcript()) == {"text": "Hello. Bye.", "usage": {"type": "duration", "seconds": 63}}
    req, _ = parse_transcription_form(TranscriptionForm(fields={"model": ["m"], "response_format": ["verbose_json"]},
                                                        files=FILE))
    verbose = answer(req, transcript())
    assert verbose["segments"][0] == {"id": 1, "seek": 0, "start": 0.0, "end": 2.25, "text": " Hello.", "tokens": [1],
                                      "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0,
                                      "no_speech_prob": 0.0}
    assert "words" not in verbose and verbose["language"] == "en"
    assert timestamp(3725.5, ",") == "01:02:05,500"
    assert subtitles(transcript().segments, vtt=False) == (
        "1\n00:00:00,000 --> 00:00:02,250\nHello.\n\n2\n00:01:01,000 --> 01:02:05,500\nBye.\n")
    assert subtitles(transcript().segments, vtt=True).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.250\nHello.\n")


def test_streamed_wav_and_pcm():
    enc = Encoder(pb.AUDIO_FORMAT_WAV, 22050)
    data = enc.encode(b"\x01\x00" * 100) + enc.encode(b"\x02\x00" * 50) + enc.finish()
    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"  # streamed: sizes unknown
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.readframes(1000)) == (22050, b"\x01\x00" * 100 + b"\x02\x00" * 50)
    with wave.open(io.BytesIO(wav_header(16000, 4) + b"\x00" * 4)) as w:
        assert w.getnframes() == 2
    pcm = Encoder(pb.AUDIO_FORMAT_PCM, 24000)  # OpenAI's pcm rate: nothing to resample
    assert pcm.encode(b"ab") + pcm.finish() == b"ab"


@pytest.mark.parametrize("fmt", [pb.AUDIO_FORMAT_MP3, pb.AUDIO_FORMAT_FLAC, pb.AUDIO_FORMAT_AAC, pb.AUDIO_FORMAT_OPUS])
def test_compressed_formats_decode_back(fmt):
    av = pytest.importorskip("av")
    if fmt not in available_formats():
        pytest.skip("this FFmpeg build lacks the encoder")
    enc = Encoder(fmt, 22050)
    tone = bytes(i % 251 for i in range(22050 * 2))  # one second
    data = enc.encode(tone) + enc.encode(tone) + enc.finish()
    with av.open(io.BytesIO(data)) as container:
        seconds = sum(f.samples / f.sample_rate for f in container.decode(audio=0))
    assert 1.9 < seconds < 2.2


def test_an_unavailable_format_is_refused_naming_the_supported_ones(monkeypatch):
    from services.common.errors import ServiceError
    from services.worker import audio_encoding

    monkeypatch.setattr(audio_encoding, "available_formats", lambda: (pb.AUDIO_FORMAT_WAV, pb.AUDIO_FORMAT_PCM))
    with pytest.raises(ServiceError) as e:
        Encoder(pb.AUDIO_FORMAT_MP3, 22050)
    assert e.value.field_violations[0][0] == "response_format" and "wav, pcm" in e.value.message


def test_audio_loaders_in_models_yaml():
    tts, stt = parse_models([{"name": "tts", "model": "builtin:piper-joe", "loader": "piper", "num_cpus": 0.25},
                             {"name": "stt", "model": "builtin:whisper-base", "loader": "faster_whisper"}], "m.yaml")
    assert (tts.loader, tts.usecase, tts.num_cpus) == (common_pb2.LOADER_PIPER, common_pb2.USECASE_SPEECH, 0.25)
    assert (stt.loader, stt.usecase) == (common_pb2.LOADER_FASTER_WHISPER, common_pb2.USECASE_TRANSCRIPTION)
    for bad, key in (({"model": "builtin:piper-joe"}, "loader"),
                     ({"model": "builtin:piper-joe", "loader": "piper", "usecase": "generate"}, "usecase"),
                     ({"model": "builtin:tiny-qwen2", "loader": "faster_whisper"}, "model"),
                     ({"model": "x", "usecase": "transcription"}, "usecase")):
        with pytest.raises(ConfigError) as e:
            parse_models([{"name": "a", **bad}], "m.yaml")
        assert e.value.key == f"models[0].{key}"


def test_audio_capabilities_and_threads():
    assert capabilities.parse('["piper", "faster_whisper"]') == ["faster_whisper", "piper"]
    assert capabilities.resources(["piper"]) == {capability_resource("piper"): capabilities.SLOTS}
    assert capabilities.capabilities_of({"mship_faster_whisper": 1000.0, "CPU": 2}) == ["faster_whisper"]
    assert [engine_threads(n) for n in (0, 0.25, 0.5, 1, 2.4, 3)] == [1, 1, 1, 1, 2, 3]


def test_piper_noise_from_engine_args():
    from services.worker.piper_engine import PiperEngine, noise_args

    def spec(engine_args: dict) -> common_pb2.ModelSpec:
        (parsed,) = parse_models([{"name": "tts", "model": "builtin:piper-joe", "loader": "piper",
                                   "engine_args": engine_args}], "m.yaml")
        return parsed

    assert noise_args(common_pb2.ModelSpec(name="tts")) == {}  # the voice's own
    noise = noise_args(spec({"noise_scale": 0, "noise_w_scale": 0.5}))
    assert noise == {"noise_scale": 0.0, "noise_w_scale": 0.5}
    for bad, named in (({"noise": 0}, "unknown engine_args ['noise']"), ({"noise_scale": -0.1}, "noise_scale"),
                       ({"noise_w_scale": "low"}, "noise_w_scale"), ({"noise_scale": True}, "noise_scale")):
        with pytest.raises(ValueError, match=re.escape(named)):
            noise_args(spec(bad))
    config = types.SimpleNamespace(sample_rate=22050, speaker_id_map={}, num_speakers=1, length_scale=1.0)
    engine = PiperEngine(types.SimpleNamespace(config=config), "tts", noise)
    synthesis = engine.synthesis_config("alloy", 2.0)
    assert (synthesis.noise_scale, synthesis.noise_w_scale, synthesis.length_scale) == (0.0, 0.5, 0.5)
