"""`/v1/audio/speech` and `/v1/audio/transcriptions` end to end over real sockets
(tests/unit/gateway_harness.py): the openai SDK and httpx against the real app, routed to real
`WorkerServicer`s around an audio engine double (tests/engine_double.AudioDouble, on the real
thread runner), next to a generation model; the usecase checks both ways; the worker's refusals as
400s naming the field; a client that leaves stops the engine's work."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import wave
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from tests.engine_double import AudioDouble, ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.unit.gateway_harness import SCRIPT, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, client, oai
pytestmark = pytest.mark.timeout(60)

TTS, STT, CHAT = "tts", "stt", "m"
WAV = b"RIFF....WAVEfmt " + bytes(64)  # the double hears anything


@pytest.fixture
async def audio(gateway: Gateway) -> AsyncIterator[dict[str, ServedWorker]]:
    """TTS (speech) and STT (transcription) on audio doubles, CHAT (generate) on a scripted one."""
    workers = {TTS: await serve_worker(AudioDouble(), name=TTS), STT: await serve_worker(AudioDouble(), name=STT),
               CHAT: await serve_worker(ScriptedEngine(SCRIPT))}
    usecases = {TTS: common_pb2.USECASE_SPEECH, STT: common_pb2.USECASE_TRANSCRIPTION,
                CHAT: common_pb2.USECASE_GENERATE}
    gateway.version += 1
    snapshot = cpb.RoutingSnapshot(version=gateway.version)
    for name, worker in workers.items():
        model = snapshot.models.add(name=name, version="v1", usecase=usecases[name])
        replica = model.replicas.add(replica_id=f"{name}-r0", model=name, version="v1")
        replica.endpoint.host, replica.endpoint.port = "127.0.0.1", worker.port
    await gateway.on_loop(lambda: gateway.table.apply(snapshot))
    try:
        yield workers
        await until(lambda: gateway.http.inflight == 0, "the edge to finish its requests")
        await until(lambda: all(e.outstanding == 0 for r in gateway.table.routes.values() for e in r.endpoints),
                    "the picker's outstanding counts to return to 0")
        await until(lambda: all(not w.servicer.inflight for w in workers.values()), "the workers to finish")
    finally:
        for w in workers.values():
            if isinstance(w.engine, AudioDouble) and w.engine.permits is not None:
                w.engine.permits.release(100)
            await w.server.stop(0)


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    """The module's gateway, with room for audio files (and a 64 KiB file limit of its own)."""
    gw = Gateway(max_body_bytes=2**20, max_audio_bytes=2**16)
    yield gw
    await gw.stop()


async def test_speech_streams_a_wav_the_sdk_reads(audio, oai: openai.AsyncOpenAI):
    async with oai.audio.speech.with_streaming_response.create(
            model=TTS, voice="alloy", input="One. Two. Three.", response_format="wav") as r:
        assert r.headers["content-type"] == "audio/wav" and r.headers["x-mship-sample-rate"] == "8000"
        data = await r.read()
    with wave.open(io.BytesIO(data)) as w:  # a streamed WAV: sizes unknown, the frames all there
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
        frames = w.readframes(10**6)
    assert len(frames) == 3 * int(8000 * AudioDouble.SENTENCE_S) * 2
    assert audio[TTS].engine.units == 3


async def test_speech_pcm_and_sse(audio, client: httpx.AsyncClient):
    r = await client.post("/v1/audio/speech", json={"model": TTS, "voice": "x", "input": "A. B.",
                                                    "response_format": "pcm"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
    assert r.headers["x-mship-sample-rate"] == "24000"  # OpenAI's pcm rate: the 8 kHz voice resampled
    assert len(r.content) == pytest.approx(2 * int(24000 * AudioDouble.SENTENCE_S) * 2, abs=64)
    async with client.stream("POST", "/v1/audio/speech", json={"model": TTS, "voice": "x", "input": "A. B.",
                                                               "response_format": "pcm", "stream_format": "sse"}) as r:
        events = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"} and events[-1]["type"] == "speech.audio.done"


async def test_speech_sse_that_breaks_mid_stream_ends_with_an_error_event(audio, client: httpx.AsyncClient):
    engine: AudioDouble = audio[TTS].engine
    unit = engine._unit

    def second_sentence_fails() -> None:
        unit()
        if engine.units == 2:
            raise RuntimeError("the voice broke at 0xdeadbeef")
    engine._unit = second_sentence_fails  # type: ignore[method-assign]
    async with client.stream("POST", "/v1/audio/speech", json={"model": TTS, "voice": "x", "input": "A. B. C.",
                                                               "stream_format": "sse"}) as r:
        lines = [line async for line in r.aiter_lines()]  # the stream ends cleanly (no protocol error)
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]  # as transcriptions do
    assert events[-1]["error"] == {"message": events[-1]["error"]["message"], "type": "server_error", "param": None,
                                   "code": None}
    assert "0xdeadbeef" not in events[-1]["error"]["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"voice": "alloy", "input": "hi", "speed": 9}, "speed"),
    ({"voice": "alloy", "input": "hi", "response_format": "ogg"}, "response_format"),
    ({"voice": "alloy", "input": " "}, "input"),
    ({"voice": "alloy", "input": "hi", "instructions": "whisper"}, "instructions"),
    ({"voice": "nobody", "input": "hi", "response_format": "wav"}, "voice"),  # refused by the worker
    ({"voice": "", "input": "hi"}, "voice"),
    ({"voice": {"id": " "}, "input": "hi"}, "voice"),
    ({"voice": "alloy", "input": "x" * 4097}, "input"),
    ({"voice": "alloy", "input": "hi", "colour": "red"}, "colour"),
])
async def test_speech_refusals_name_the_field(audio, client, body, param):
    r = await client.post("/v1/audio/speech", json={"model": TTS, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_usecases_are_checked_both_ways(audio, client, oai):
    with pytest.raises(openai.BadRequestError) as e:
        await oai.chat.completions.create(model=TTS, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "model" and "text-to-speech" in e.value.body["message"]
    r = await client.post("/v1/audio/speech", json={"model": CHAT, "voice": "alloy", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "text generation model" in r.json()["error"]["message"]
    r = await client.post("/v1/audio/speech", json={"model": STT, "voice": "alloy", "input": "hi"})
    assert r.status_code == 400 and "speech-to-text" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await oai.audio.transcriptions.create(model=TTS, file=("a.wav", WAV))
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError):
        await oai.embeddings.create(model=STT, input="hi")
    with pytest.raises(openai.NotFoundError):
        await oai.audio.transcriptions.create(model="nope", file=("a.wav", WAV))


async def test_transcription_formats_with_the_sdk(audio, oai: openai.AsyncOpenAI):
    t = await oai.audio.transcriptions.create(model=STT, file=("a.wav", WAV), language="en", prompt="greeting",
                                              temperature=0.2)
    assert t.text == "Hello world." and t.usage.type == "duration" and t.usage.seconds == 3
    heard, options = audio[STT].engine.heard[-1]
    assert heard == WAV and (options.language, options.prompt) == ("en", "greeting")
    assert options.temperature == pytest.approx(0.2)
    v = await oai.audio.transcriptions.create(model=STT, file=("a.wav", WAV), response_format="verbose_json",
                                              timestamp_granularities=["word", "segment"])
    assert v.language == "en" and v.duration == 3.0 and [s.text for s in v.segments] == [" Hello", " world."]
    assert [w.word for w in v.words] == ["Hello", "world."] and audio[STT].engine.heard[-1][1].word_timestamps
    text = await oai.audio.transcriptions.create(model=STT, file=("a.wav", WAV), response_format="text")
    assert text == "Hello world.\n"
    srt = await oai.audio.transcriptions.create(model=STT, file=("a.wav", WAV), response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,500\nHello\n\n2\n00:00:01,500 --> 00:00:03,000\nworld.")
    vtt = await oai.audio.transcriptions.create(model=STT, file=("a.wav", WAV), response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello\n")


async def test_transcription_streams_text_deltas(audio, oai: openai.AsyncOpenAI):
    stream = await oai.audio.transcriptions.create(model=STT, file=("a.wav", WAV), stream=True)
    events = [e async for e in stream]
    assert [e.type for e in events] == ["transcript.text.delta", "transcript.text.delta", "transcript.text.done"]
    assert "".join(e.delta for e in events[:2]) == events[-1].text == "Hello world."


@pytest.mark.parametrize(("fields", "files", "param", "status"), [
    ({"model": STT}, {}, "file", 400),
    ({"model": STT, "temperature": "hot"}, {"file": ("a.wav", WAV)}, "temperature", 400),
    ({"model": STT, "response_format": "srt", "stream": "true"}, {"file": ("a.wav", WAV)}, "stream", 400),
    ({"model": STT, "timestamp_granularities[]": "word"}, {"file": ("a.wav", WAV)}, "timestamp_granularities", 400),
    ({"model": STT, "language": "xx"}, {"file": ("a.wav", WAV)}, "language", 400),  # refused by the worker
    ({"model": STT, "colour": "red"}, {"file": ("a.wav", WAV)}, "colour", 400),
    ({"model": STT}, {"file": ("a.wav", b"")}, "file", 400),
    ({"model": STT}, {"file": ("a.wav", bytes(2**16 + 1))}, "file", 413),
])
async def test_transcription_refusals_name_the_field(audio, client, fields, files, param, status):
    r = await client.post("/v1/audio/transcriptions", data=fields, files=files)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


async def test_transcription_needs_a_form(audio, client):
    r = await client.post("/v1/audio/transcriptions", json={"model": STT})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"


async def test_a_client_that_leaves_mid_speech_stops_the_engine(audio, gateway: Gateway):
    engine: AudioDouble = audio[TTS].engine
    engine.permits = threading.Semaphore(1)  # the first sentence only, until the test says more
    body = json.dumps({"model": TTS, "voice": "alloy", "input": "A. " * 20, "response_format": "pcm"}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http.port)
    writer.write(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        await reader.read(1)  # audio flows
    writer.close()
    await until(lambda: not audio[TTS].servicer.inflight, "the worker's handler to be cancelled")
    engine.permits.release(100)  # were it still running, it would now speak every sentence
    await until(lambda: engine.stats().running_requests == 0, "the engine's thread to stop")
    assert engine.units <= 2  # the sentence under way when the call ended, at most, and none after it


async def test_a_client_that_leaves_mid_transcription_stops_the_engine(audio, gateway: Gateway):
    engine: AudioDouble = audio[STT].engine
    engine.segments = tuple(f" part {i}." for i in range(20))
    engine.permits = threading.Semaphore(0)  # held before the first segment: no answer yet
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        task = asyncio.ensure_future(c.post("/v1/audio/transcriptions", data={"model": STT},
                                            files={"file": ("a.wav", WAV)}))
        await until(lambda: engine.stats().running_requests == 1, "the engine to start")
        task.cancel()  # the client hangs up while the edge waits for the transcript
        with pytest.raises(asyncio.CancelledError):
            await task
    await until(lambda: not audio[STT].servicer.inflight, "the worker's handler to be cancelled")
    engine.permits.release(100)
    await until(lambda: engine.stats().running_requests == 0, "the engine's thread to stop")
    assert engine.units <= 1


async def test_cancel_by_id_ends_the_stream_cancelled(audio):
    import grpc

    from mship.worker.v1 import worker_pb2 as pb
    from mship.worker.v1 import worker_pb2_grpc

    engine: AudioDouble = audio[TTS].engine
    engine.permits = threading.Semaphore(1)
    async with grpc.aio.insecure_channel(audio[TTS].address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        call = stub.Synthesize(pb.SynthesizeRequest(request_id="r1", model=TTS, input="A. B. C.",
                                                    format=pb.AUDIO_FORMAT_PCM))
        assert (await call.read()).WhichOneof("event") == "start"
        assert (await stub.Cancel(pb.CancelRequest(request_ids=["r1"]))).cancelled == ["r1"]
        engine.permits.release(100)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            while await call.read() is not grpc.aio.EOF:
                pass
        assert e.value.code() == grpc.StatusCode.CANCELLED
    await until(lambda: engine.stats().running_requests == 0, "the engine's thread to stop")


async def test_a_replica_that_cannot_answer_is_passed_over_before_the_first_byte(gateway: Gateway, client):
    loading = await serve_worker(AudioDouble(), name=TTS, ready=False)  # answers NOT_READY (UNAVAILABLE)
    ready = await serve_worker(AudioDouble(), name=TTS)
    try:
        for addresses, status in (((loading, ready), 200), ((loading,), 503)):
            gateway.version += 1
            snapshot = cpb.RoutingSnapshot(version=gateway.version)
            model = snapshot.models.add(name=TTS, version="v1", usecase=common_pb2.USECASE_SPEECH)
            for i, worker in enumerate(addresses):
                replica = model.replicas.add(replica_id=f"r{i}", model=TTS, version="v1")
                replica.endpoint.host, replica.endpoint.port = "127.0.0.1", worker.port
            await gateway.on_loop(lambda snapshot=snapshot: gateway.table.apply(snapshot))
            busier = [e for e in gateway.table.routes[TTS].endpoints if e.address == ready.address]
            for e in busier:  # the picker tries the loading replica first
                e.outstanding += 1
            r = await client.post("/v1/audio/speech", json={"model": TTS, "voice": "a", "input": "One. Two.",
                                                            "response_format": "pcm"})
            for e in busier:
                e.outstanding -= 1
            assert r.status_code == status, r.text
        assert ready.engine.units == 2 and loading.engine.units == 0
        assert r.headers.get("retry-after")
    finally:
        for w in (loading, ready):
            await w.server.stop(0)
