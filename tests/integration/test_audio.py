"""Speech and transcription on the real platform with the real engines: builtin:piper-joe on the
`piper` loader (without sampling noise: `engine_args` noise_scale and noise_w_scale 0) and
builtin:whisper-base on `faster_whisper`, deployed beside the session's `tiny`
(an additive deploy, each on a quarter CPU: fractional sharing with the LLM engine on one node),
reconciled away afterwards.

Through one gateway: `/v1/audio/speech` from the TTS model, its bytes sent straight back to
`/v1/audio/transcriptions` on the STT model, the transcript holds the spoken words. With the voice's
own noise, Piper's audio differs on every call and whisper-base misheard a word in 5 of 100 round
trips ("quit brown fox", "jumped"); without it, the same text gives the same audio, every time. A
client that leaves during synthesis or transcription stops the engine's work: the worker's own report
(`GetLoad`: the engine's running requests, the audio seconds it produced or heard) says so.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from tests.helpers import raw_headers, until_sync
from tests.integration.conftest import PLATFORM_MODELS
from tests.platform_process import PlatformProcess, mship

pytestmark = pytest.mark.integration
TTS, STT = "piper-joe", "whisper-base"
SENTENCE = "The quick brown fox jumps over the lazy dog."
WORDS = ("quick", "brown", "fox", "jumps", "lazy", "dog")
LONG = " ".join(f"Sentence number {i} is about a quick brown fox." for i in range(40))
STOP_DEADLINE_S = 15.0  # one sentence / one decoding window on a shared core, with room


@pytest.fixture(scope="module")
def models(platform: PlatformProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    home = Path(tmp_path_factory.mktemp("audio"))
    (home / "audio.yaml").write_text(
        f"models:\n  - name: {TTS}\n    model: builtin:piper-joe\n    loader: piper\n    num_cpus: 0.25\n"
        "    engine_args: {noise_scale: 0, noise_w_scale: 0}\n"
        f"  - name: {STT}\n    model: builtin:whisper-base\n    loader: faster_whisper\n    num_cpus: 0.25\n")
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "audio.yaml"), "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    yield
    (home / "session.yaml").write_text(PLATFORM_MODELS)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "session.yaml"),
                "--reconcile", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture
def client(platform: PlatformProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=platform.api_key, max_retries=0, timeout=300)


def worker_report(platform: PlatformProcess, model: str) -> pb.LoadReport:
    (route,) = [m for m in platform.routing().models if m.name == model]
    endpoint = route.replicas[0].endpoint
    with grpc.insecure_channel(f"{endpoint.host}:{endpoint.port}") as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetLoad(pb.GetLoadRequest(), timeout=10)


def speak(client: openai.OpenAI, text: str, fmt: str) -> tuple[bytes, str, float]:
    t0 = time.monotonic()
    with client.audio.speech.with_streaming_response.create(model=TTS, voice="alloy", input=text,
                                                            response_format=fmt) as r:
        content_type = r.headers["content-type"]
        audio = r.read()
    return audio, content_type, time.monotonic() - t0


@pytest.mark.parametrize(("fmt", "media_type"), [("wav", "audio/wav"), ("mp3", "audio/mpeg")])
def test_speech_round_trips_through_transcription(platform, models, client, fmt, media_type):
    audio, content_type, synth_s = speak(client, SENTENCE, fmt)
    assert content_type == media_type and len(audio) > 1000
    t0 = time.monotonic()
    transcript = client.audio.transcriptions.create(model=STT, file=(f"speech.{fmt}", audio))
    stt_s = time.monotonic() - t0
    heard = transcript.text.lower()
    assert all(word in heard for word in WORDS), transcript.text
    assert transcript.usage is not None and transcript.usage.type == "duration" and transcript.usage.seconds >= 2
    print(f"\n{fmt}: synthesis {synth_s:.2f}s ({len(audio)} bytes), transcription {stt_s:.2f}s: {transcript.text!r}")
    verbose = client.audio.transcriptions.create(model=STT, file=("speech.wav", audio), language="en",
                                                 response_format="verbose_json", timestamp_granularities=["word"])
    assert verbose.language == "en" and "fox" in [w.word.strip(" .").lower() for w in verbose.words]


def test_speech_without_noise_is_the_same_every_time(platform, models, client):
    first, second = speak(client, SENTENCE, "wav"), speak(client, SENTENCE, "wav")
    assert first[0] == second[0]


def test_usecases_are_refused_clearly(platform, models, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=TTS, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="tiny", voice="alloy", input="hi")
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=STT, file=("a.wav", b"this is no audio"))
    assert e.value.body["param"] == "file"


def post(platform: PlatformProcess, request: httpx.Request, until_bytes: int = 0) -> socket.socket:
    """Send `request` on a raw socket and read `until_bytes` of the answer; the caller hangs up."""
    body = request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
    sock = socket.create_connection(("127.0.0.1", platform.http_port))
    sock.sendall(f"POST {request.url.raw_path.decode()} HTTP/1.1\r\nHost: x\r\n".encode() + raw_headers(headers)
                 + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while len(seen) < until_bytes:
        data = sock.recv(65536)
        assert data, seen[:300]
        seen += data
    return sock


def stopped(platform: PlatformProcess, model: str) -> pb.LoadReport:
    """The worker's report once its engine runs nothing and no call is open (within the deadline)."""
    reports: list[pb.LoadReport] = []

    def idle() -> bool:
        reports.append(worker_report(platform, model))
        return reports[-1].running_requests == 0 and reports[-1].inflight_calls == 0

    until_sync(idle, f"{model}'s engine to stop", timeout_s=STOP_DEADLINE_S, poll_s=0.05)
    return reports[-1]


def test_disconnect_during_synthesis_stops_the_engine(platform, models):
    before = worker_report(platform, TTS).audio_seconds_total
    request = httpx.Request("POST", f"{platform.base_url}/v1/audio/speech", headers=platform.headers,
                            json={"model": TTS, "voice": "alloy", "input": LONG, "response_format": "pcm"})
    post(platform, request, until_bytes=4096).close()  # hang up after the first sentence's audio
    report = stopped(platform, TTS)
    spoken = report.audio_seconds_total - before
    # 40 sentences are well over a minute of speech: the engine stopped after a sentence or two
    print(f"\nsynthesis stopped after {spoken:.1f}s of speech")
    assert 0 < spoken < 20, spoken
    assert worker_report(platform, TTS).audio_seconds_total == report.audio_seconds_total


def test_disconnect_during_transcription_stops_the_engine(platform, models, client):
    audio, _, _ = speak(client, LONG, "mp3")  # about two minutes of speech: several decoding windows
    before = worker_report(platform, STT)
    request = httpx.Request("POST", f"{platform.base_url}/v1/audio/transcriptions", headers=platform.headers,
                            data={"model": STT, "language": "en"}, files={"file": ("long.mp3", audio)})
    sock = post(platform, request)
    until_sync(lambda: worker_report(platform, STT).running_requests == 1, "the transcription to start",
               timeout_s=STOP_DEADLINE_S, poll_s=0.02)
    sock.close()  # the client hangs up while the transcript is being made
    report = stopped(platform, STT)
    heard = report.audio_seconds_total - before.audio_seconds_total
    print(f"\ntranscription stopped after {heard:.1f}s of {len(audio)}-byte audio")
    assert heard < 60, heard  # not the whole recording: decoding stopped within a window of the hang-up
    assert worker_report(platform, STT).audio_seconds_total == report.audio_seconds_total
