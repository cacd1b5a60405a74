"""The OpenAI HTTP edge end to end over real sockets: the real app (`create_app`) served by the real
`ReusePortServer` (uvicorn in its own uvloop thread), routed by a `RouteTable` fed hand-built
routing snapshots to real `WorkerServicer`s on grpc.aio servers around an engine double
(tests/engine_double.py). Clients: the openai SDK, httpx, and raw sockets where a test must hang up.

Synchronisation is by polling observable state against a deadline (`tests.helpers.until`), never by sleeping.
After every test the edge, the picker and the workers must hold no request any more.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mship.common.v1 import common_pb2
from services.gateway.edge.metrics import REQUESTS
from tests.helpers import until
from tests.platform_process import free_port
from tests.unit.gateway_harness import (
    CHAT,
    MODEL,
    SERVER_ID,
    SLASHED,
    Gateway,
    hang_up,
    raw_post,
    read_until,
    served_by,
    sse,
)

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, workers, client, oai
pytestmark = pytest.mark.timeout(60)


# ---- success paths -----------------------------------------------------------------------------

async def test_chat_through_the_openai_sdk(workers, oai):
    raw = await oai.chat.completions.with_raw_response.create(model=MODEL, messages=[
        {"role": "user", "content": "one two three"}])
    assert raw.headers["x-mship-gateway"] == SERVER_ID
    completion = raw.parse()
    assert isinstance(completion, ChatCompletion)
    assert completion.id.startswith("chatcmpl-") and completion.model == MODEL
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", "Hello world!", "stop")
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 3)
    assert sorted(served_by(*workers)) == [0, 1]  # one worker call, on one replica


async def test_chat_stream_through_the_openai_sdk_and_raw_sse(workers, oai, client):
    stream = await oai.chat.completions.create(model=MODEL, messages=CHAT["messages"], stream=True,
                                               stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3

    r, events = await sse(client, "/v1/chat/completions", {**CHAT, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-mship-gateway"] == SERVER_ID
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])


async def test_completions_whole_and_streamed(workers, oai, client):
    completion = await oai.completions.create(model=MODEL, prompt="once upon a time")
    assert isinstance(completion, Completion) and completion.object == "text_completion"
    assert (completion.choices[0].text, completion.choices[0].finish_reason) == ("Hello world!", "stop")
    assert completion.usage.prompt_tokens == 4

    r, events = await sse(client, "/v1/completions", {"model": MODEL, "prompt": "hi", "stream": True})
    assert r.status_code == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_models_list_and_retrieve(workers, oai, client):
    assert [m.id for m in (await oai.models.list()).data] == [MODEL, SLASHED]
    assert (await oai.models.retrieve(MODEL)).id == MODEL
    assert (await oai.models.retrieve(SLASHED)).id == SLASHED  # the SDK sends org%2Fbig
    assert (await client.get(f"/v1/models/{SLASHED}")).json()["id"] == SLASHED
    for unknown in ("nope", "org/nope", "m/extra"):
        r = await client.get(f"/v1/models/{unknown}")
        assert r.status_code == 404, unknown
        assert r.json()["error"] == {"message": f"The model '{unknown}' does not exist or you do not have access to "
                                                "it.", "type": "invalid_request_error", "param": "model",
                                     "code": "model_not_found"}
    with pytest.raises(openai.NotFoundError):
        await oai.models.retrieve("org/nope")


async def test_health_and_readiness():
    gw = Gateway(server_id="gw-test-2")
    try:
        async with httpx.AsyncClient(base_url=gw.url) as client:
            r = await client.get("/health")
            assert (r.status_code, r.json(), r.headers["x-mship-gateway"]) == (200, {"status": "ok"}, "gw-test-2")

            r = await client.get("/readyz")  # no snapshot yet
            assert r.status_code == 503
            assert (await client.get("/readyz?scope=gateway")).status_code == 503  # no routes: no traffic
            assert (await client.get("/readyz?scope=everything")).json()["error"]["param"] == "scope"
            assert {k: r.json()[k] for k in ("ready", "loaded", "pending")} == {"ready": False, "loaded": [],
                                                                                 "pending": []}
            r = await client.post("/v1/chat/completions", json=CHAT)  # routes unknown yet: retry soon
            assert r.status_code == 503 and r.headers["retry-after"] == "2"

            await gw.route(f"127.0.0.1:{free_port()}", pending=("later",), slashed=False)
            r = await client.get("/readyz")
            assert r.status_code == 503
            assert {k: r.json()[k] for k in ("ready", "loaded", "pending", "routing_version")} == {
                "ready": False, "loaded": [MODEL], "pending": ["later"], "routing_version": 1}
            r = await client.post("/v1/chat/completions", json={**CHAT, "model": "later"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
            # the Kubernetes probe: this gateway routes, so it takes traffic; a pending model is not its fault
            r = await client.get("/readyz?scope=gateway")
            assert (r.status_code, r.json()["ready"], r.json()["pending"]) == (200, True, ["later"])

            await gw.route(f"127.0.0.1:{free_port()}")
            r = await client.get("/readyz")
            assert (r.status_code, r.json()["ready"], r.json()["pending"]) == (200, True, [])
            assert r.json()["load_times_s"] == {}  # the coordinator is unreachable: no detail, still ready
    finally:
        await gw.stop()


# ---- client disconnects cancel the worker call -------------------------------------------------

async def test_disconnect_mid_stream_cancels_the_worker_call(workers, gateway):
    for w in workers:
        w.engine.hold.clear()  # park after the first chunks
    reader, writer = await raw_post(gateway.http.port, "/v1/chat/completions", {**CHAT, "stream": True})
    head = await read_until(reader, b"Hello")
    assert b" 200 OK" in head.split(b"\r\n")[0] and b"x-mship-gateway: " + SERVER_ID.encode() in head
    (served,) = [w for w in workers if w.engine.started]
    assert served.servicer.inflight
    await hang_up(writer)
    await until(lambda: served.engine.cancelled == served.engine.started, "the engine request to be cancelled")
    await until(lambda: not served.servicer.inflight, "the worker to drop the request")
    assert not served.engine.aborted  # cancelled through the call, not by a Cancel RPC


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_before_the_first_token_cancels_the_worker_call(workers, gateway, stream):
    for w in workers:
        w.engine.first_hold.clear()  # park before the first chunk
    reader, writer = await raw_post(gateway.http.port, "/v1/chat/completions", {**CHAT, "stream": stream})
    await until(lambda: any(w.engine.started for w in workers), "the request to reach an engine")
    (served,) = [w for w in workers if w.engine.started]
    await hang_up(writer)
    await until(lambda: served.engine.cancelled == served.engine.started, "the engine request to be cancelled")
    await until(lambda: not served.servicer.inflight, "the worker to drop the request")
    assert await reader.read() == b""  # nothing was answered: no status line, no body


async def test_disconnect_while_assembling_cancels_the_worker_call(workers, gateway):
    for w in workers:
        w.engine.hold.clear()  # the first chunks are out, the last never comes
    _, writer = await raw_post(gateway.http.port, "/v1/chat/completions", CHAT)
    await until(lambda: any(w.servicer.inflight and w.engine.started for w in workers), "generation to start")
    (served,) = [w for w in workers if w.engine.started]
    await hang_up(writer)
    await until(lambda: served.engine.cancelled == served.engine.started, "the engine request to be cancelled")


def answered(status: str) -> float:
    return sum(s.value for m in REQUESTS.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["status"] == status)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
async def test_a_client_gone_while_sending_its_body_is_a_499_not_a_server_error(gateway, path, caplog):
    before = answered("499"), answered("500")
    _, writer = await asyncio.open_connection("127.0.0.1", gateway.http.port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: 1000\r\n\r\n".encode() + b'{"model": "m", ')  # 15 of its 1000 bytes
    await writer.drain()
    await until(lambda: gateway.http.inflight == 1, "the request to be read")
    await hang_up(writer)
    await until(lambda: gateway.http.inflight == 0, "the request to end")
    assert (answered("499"), answered("500")) == (before[0] + 1, before[1])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback for a client gone


# ---- replica choice ----------------------------------------------------------------------------

async def test_dead_endpoint_is_retried_on_a_live_one(workers, gateway, oai):
    live, _ = workers
    dead = f"127.0.0.1:{free_port()}"
    await gateway.route(dead, live.address)
    # The live replica looks busier, so the picker tries the dead one first.
    threshold = gateway.table.breaker.threshold
    for i in range(threshold):  # each tries the dead one first: a failure on its breaker each time
        await gateway.on_loop(lambda: setattr(gateway.endpoint(live.address), "outstanding", 1))
        try:
            completion = await oai.chat.completions.create(model=MODEL, messages=CHAT["messages"])
        finally:
            await gateway.on_loop(lambda: setattr(gateway.endpoint(live.address), "outstanding", 0))
        assert completion.choices[0].message.content == "Hello world!"
        assert len(live.engine.started) == i + 1  # retried on the live one: the client never saw the dead one
    assert [e.address for e in gateway.table.candidates(MODEL)] == [live.address]  # open: skipped from now on
    assert gateway.endpoint(dead).outstanding == 0


async def test_overloaded_replica_is_not_skipped_once_it_recovers(workers, gateway, client):
    busy, other = workers
    busy.servicer.gate.apply(common_pb2.ReplicaLimits())  # no place, no queue: RESOURCE_EXHAUSTED / OVERLOADED
    await gateway.on_loop(lambda: setattr(gateway.endpoint(other.address), "outstanding", 1))
    try:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # retried elsewhere
        assert served_by(busy, other) == [0, 1]
        # recovered; `other` still looks busier, so `busy` must get this one
        busy.servicer.gate.apply(common_pb2.ReplicaLimits(max_ongoing_requests=8))
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert served_by(busy, other) == [1, 1]
    finally:
        await gateway.on_loop(lambda: setattr(gateway.endpoint(other.address), "outstanding", 0))
