"""The OpenAI HTTP edge end to end over real sockets: the real app (`create_app`) served by the real
`ReusePortServer` (uvicorn in its own uvloop thread), routed by a `RouteTable` fed hand-built
routing snapshots to real `WorkerServicer`s on grpc.aio servers around an engine double
(tests/engine_double.py). Clients: the openai SDK, httpx, and raw sockets where a test must hang up.

Synchronisation is by polling observable state against a deadline (`until`), never by sleeping.
After every test the edge, the picker and the workers must hold no request any more.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common.routes import Endpoint, RouteTable
from services.gateway.app import GatewaySettings, create_app
from services.gateway.http_server import ReusePortServer
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.platform_process import free_port

MODEL = "m"
SLASHED = "org/big"  # routed, no replica: exercises the `{model_id:path}` route
SCRIPT = ["Hello", " world", "!"]
MAX_BODY = 2048
SERVER_ID = "gw-test-1"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "say hi"}]}
pytestmark = pytest.mark.timeout(60)


# ---- harness -----------------------------------------------------------------------------------

async def until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class Gateway:
    """The edge as a gateway replica runs it, minus Ray: app + ReusePortServer + RouteTable."""

    def __init__(self, *, server_id: str = SERVER_ID, drain_s: float = 0, **settings: Any) -> None:
        self.table = RouteTable()
        config = GatewaySettings(coordinator=f"127.0.0.1:{free_port()}", **{"max_body_bytes": MAX_BODY, **settings})
        self.http = ReusePortServer(create_app(self.table, config), "127.0.0.1", 0, on_stop=self.table.close,
                                    drain_s=drain_s, graceful_s=2, server_id=server_id)
        self.http.start()
        self.url = f"http://127.0.0.1:{self.http.port}"
        self.version = 0

    async def on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's event loop (the table's channels live there)."""
        async def call() -> Any:
            return fn()
        assert self.http.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self.http.loop))

    async def route(self, *addresses: str, pending: tuple[str, ...] = (), slashed: bool = True) -> None:
        """Apply a snapshot routing MODEL to `addresses` (and SLASHED to nothing)."""
        self.version += 1
        snapshot = cpb.RoutingSnapshot(version=self.version, pending=list(pending))
        model = snapshot.models.add(name=MODEL, version="v1", max_model_len=64)
        for i, address in enumerate(addresses):
            host, port = address.rsplit(":", 1)
            replica = model.replicas.add(replica_id=f"r{i}", model=MODEL, version="v1")
            replica.endpoint.host, replica.endpoint.port = host, int(port)
        if slashed:
            snapshot.models.add(name=SLASHED, version="v1", max_model_len=64)
        await self.on_loop(lambda: self.table.apply(snapshot))

    def endpoint(self, address: str) -> Endpoint:
        return next(e for e in self.table.routes[MODEL].endpoints if e.address == address)

    async def stop(self) -> None:
        await self.http.drain_and_stop()


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway()
    yield gw
    await gw.stop()


@pytest.fixture
async def workers(gateway: Gateway) -> AsyncIterator[tuple[ServedWorker, ServedWorker]]:
    """Two live replicas of MODEL, routed; afterwards nothing may still hold a request."""
    a, b = await serve_worker(ScriptedEngine(SCRIPT)), await serve_worker(ScriptedEngine(SCRIPT))
    await gateway.route(a.address, b.address)
    try:
        yield a, b
        await until(lambda: gateway.http.inflight == 0, "the edge to finish its requests")
        await until(lambda: all(e.outstanding == 0 for r in gateway.table.routes.values() for e in r.endpoints),
                    "the picker's outstanding counts to return to 0")
        await until(lambda: not a.servicer.inflight and not b.servicer.inflight, "the workers to finish")
    finally:
        for w in (a, b):
            w.engine.hold.set()
            w.engine.first_hold.set()
            await w.server.stop(0)


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


@pytest.fixture
async def oai(gateway: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-test", max_retries=0,
                                  timeout=10) as c:
        yield c


async def sse(client: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """POST and read the whole event stream: the response and its `data:` payloads, in order."""
    async with client.stream("POST", path, json=payload) as r:
        lines = [line async for line in r.aiter_lines()]
    events = [line.removeprefix("data: ") for line in lines if line]
    assert all(line.startswith("data: ") for line in lines if line), lines
    return r, events


async def raw_post(port: int, path: str, payload: dict[str, Any]) -> tuple[asyncio.StreamReader,
                                                                          asyncio.StreamWriter]:
    """A POST on a plain socket, so the test decides exactly when the client hangs up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(payload).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    return reader, writer


async def read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    buf = b""
    async with asyncio.timeout(5):
        while marker not in buf:
            data = await reader.read(4096)
            assert data, f"the server closed before {marker!r}: {buf!r}"
            buf += data
    return buf


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def served_by(*workers: ServedWorker) -> list[int]:
    return [len(w.engine.started) for w in workers]


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

            await gw.route(f"127.0.0.1:{free_port()}")
            r = await client.get("/readyz")
            assert (r.status_code, r.json()["ready"], r.json()["pending"]) == (200, True, [])
            assert r.json()["load_times_s"] == {}  # the coordinator is unreachable: no detail, still ready
    finally:
        await gw.stop()


async def test_cache_salt_follows_the_caller(workers, gateway, client, monkeypatch):
    a, _ = workers
    await gateway.route(a.address)
    salts = []
    for headers in ({}, {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"},
                    {"Authorization": "Bearer k1"}, {"x-mship-identity": "team-a"}):
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
        salts.append(a.engine.renders[-1].cache_salt)
    anonymous, k1, k2, k1_again, untrusted = salts
    assert anonymous is None and untrusted is None  # the header counts only from a trusted layer
    assert k1 and k2 and len({k1, k2}) == 2 and k1_again == k1
    monkeypatch.setenv("MSHIP_TRUST_IDENTITY_HEADER", "1")
    assert (await client.post("/v1/chat/completions", json=CHAT, headers={"x-mship-identity": "team-a"})
            ).status_code == 200
    team = a.engine.renders[-1].cache_salt
    assert team and team not in (k1, k2)


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


# ---- replica choice ----------------------------------------------------------------------------

async def test_dead_endpoint_is_retried_on_a_live_one(workers, gateway, oai):
    live, _ = workers
    dead = f"127.0.0.1:{free_port()}"
    await gateway.route(dead, live.address)
    # The live replica looks busier, so the picker tries the dead one first.
    await gateway.on_loop(lambda: setattr(gateway.endpoint(live.address), "outstanding", 1))
    try:
        completion = await oai.chat.completions.create(model=MODEL, messages=CHAT["messages"])
    finally:
        await gateway.on_loop(lambda: setattr(gateway.endpoint(live.address), "outstanding", 0))
    assert completion.choices[0].message.content == "Hello world!"
    assert len(live.engine.started) == 1
    assert [e.address for e in gateway.table.candidates(MODEL)] == [live.address]  # skipped from now on
    assert gateway.endpoint(dead).outstanding == 0


async def test_overloaded_replica_is_not_skipped_once_it_recovers(workers, gateway, client):
    busy, other = workers
    busy.servicer.max_inflight = 0  # answers RESOURCE_EXHAUSTED / OVERLOADED
    await gateway.on_loop(lambda: setattr(gateway.endpoint(other.address), "outstanding", 1))
    try:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # retried elsewhere
        assert served_by(busy, other) == [0, 1]
        busy.servicer.max_inflight = 8  # recovered; `other` still looks busier, so `busy` must get this one
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert served_by(busy, other) == [1, 1]
    finally:
        await gateway.on_loop(lambda: setattr(gateway.endpoint(other.address), "outstanding", 0))


# ---- errors ------------------------------------------------------------------------------------

def error_of(r: httpx.Response, status: int, server_id: str = SERVER_ID) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["x-mship-gateway"] == server_id
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def test_request_validation_errors(workers, client):
    err = error_of(await client.post("/v1/chat/completions", content=b'{"model": "m", "messages": [',
                                     headers={"content-type": "application/json"}), 400)
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_json")

    err = error_of(await client.post("/v1/chat/completions", json={**CHAT, "temperature": "hot"}), 400)
    assert err["param"] == "temperature" and "expected a decimal, but got a string" in err["message"]

    err = error_of(await client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "best_of": 2}), 400)
    assert err["param"] == "best_of"

    err = error_of(await client.post("/v1/chat/completions", json={**CHAT, "frobnicate": 1}), 400)
    assert (err["param"], err["message"]) == ("frobnicate", "Unrecognized request argument supplied: frobnicate")

    err = error_of(await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}), 404)
    assert (err["code"], err["param"]) == ("model_not_found", "model")

    err = error_of(await client.get("/v1/nothing-here"), 404)
    assert err["type"] == "invalid_request_error"
    assert served_by(*workers) == [0, 0]  # none of these reached a worker


async def test_body_limit(workers, client):
    padded = {**CHAT, "user": "x" * (MAX_BODY - len(json.dumps(CHAT)) - 20)}
    assert len(json.dumps(padded)) < MAX_BODY
    assert (await client.post("/v1/chat/completions", json=padded)).status_code == 200

    over = {**CHAT, "user": "x" * MAX_BODY}
    err = error_of(await client.post("/v1/chat/completions", json=over), 413)
    assert err["code"] == "request_too_large"

    body = json.dumps(over).encode()

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit holds while reading
        for i in range(0, len(body), 512):
            yield body[i:i + 512]

    r = await client.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert error_of(r, 413)["code"] == "request_too_large"
    assert sum(served_by(*workers)) == 1  # only the padded one reached a worker
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # the edge still serves


async def test_context_too_long_is_400_context_length_exceeded(workers, client):
    long = " ".join(["word"] * 70)  # the double's context is 64 tokens, one per word
    err = error_of(await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": long}]}), 400)
    assert (err["code"], err["param"], err["type"]) == ("context_length_exceeded", "messages", "invalid_request_error")
    assert "maximum context length is 64 tokens" in err["message"]
    err = error_of(await client.post("/v1/completions", json={"model": MODEL, "prompt": long}), 400)
    assert (err["code"], err["param"]) == ("context_length_exceeded", "prompt")


async def test_all_replicas_overloaded_is_429_with_retry_after(workers, client, oai):
    for w in workers:
        w.servicer.max_inflight = 0
    r = await client.post("/v1/chat/completions", json=CHAT)
    err = error_of(r, 429)
    assert (err["type"], err["code"], r.headers["retry-after"]) == ("rate_limit_error", "overloaded", "1")
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})  # before the first token
    assert error_of(r, 429)["code"] == "overloaded"
    with pytest.raises(openai.RateLimitError):
        await oai.chat.completions.create(model=MODEL, messages=CHAT["messages"])


async def test_worker_error_before_the_first_token_is_500_and_not_retried(workers, client):
    for w in workers:
        w.engine.fail = True
    err = error_of(await client.post("/v1/chat/completions", json=CHAT), 500)
    assert err["type"] == "server_error" and "exploded" not in err["message"]  # no internals leak
    assert sorted(served_by(*workers)) == [0, 1]  # an engine error is not a reason to try elsewhere


async def test_worker_error_after_the_first_token_is_an_sse_error_event(workers, client, oai):
    for w in workers:
        w.engine.fail_at = 1  # "Hello" goes out, then the engine fails
    r, events = await sse(client, "/v1/chat/completions", {**CHAT, "stream": True})
    assert r.status_code == 200  # the status line went out with the first token
    *chunks, error, done = events
    assert done == "[DONE]"
    assert "".join(json.loads(c)["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello"
    assert json.loads(error)["error"]["type"] == "server_error"

    with pytest.raises(openai.APIError):
        async for _ in await oai.chat.completions.create(model=MODEL, messages=CHAT["messages"], stream=True):
            pass

    err = error_of(await client.post("/v1/chat/completions", json=CHAT), 500)  # not streamed: a plain 500
    assert err["type"] == "server_error"


async def test_request_timeout_is_504_or_a_timeout_event(workers):
    a, _ = workers
    gw = Gateway(server_id="gw-timeout", request_timeout_s=0.3)
    try:
        await gw.route(a.address)
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
            a.engine.first_hold.clear()
            err = error_of(await client.post("/v1/chat/completions", json=CHAT), 504, server_id="gw-timeout")
            assert (err["code"], err["type"]) == ("timeout", "server_error")
            await until(lambda: a.engine.cancelled == a.engine.started, "the deadline to end the engine request")
            a.engine.first_hold.set()
            a.engine.hold.clear()  # first token out, then nothing
            r, events = await sse(client, "/v1/chat/completions", {**CHAT, "stream": True})
            assert r.status_code == 200 and events[-1] == "[DONE]"
            assert json.loads(events[-2])["error"]["code"] == "timeout"
        await until(lambda: len(a.engine.cancelled) == 2 and not a.servicer.inflight,
                    "the worker to drop the timed-out requests")
    finally:
        await gw.stop()


# ---- the replica's HTTP server -----------------------------------------------------------------

async def test_drain_closes_keepalive_connections_and_stops_listening(workers):
    a, _ = workers
    gw = Gateway(server_id="gw-drain", drain_s=1.0)
    await gw.route(a.address)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.headers.get("connection") != "close"
        stopping = asyncio.create_task(gw.stop())
        await until(lambda: gw.http.draining and not any(s.is_serving() for s in gw.http.server.servers),
                    "the listener to close")
        r = await client.post("/v1/chat/completions", json=CHAT)  # on the kept-alive connection
        assert (r.status_code, r.headers["connection"], r.headers["x-mship-gateway"]) == (200, "close", "gw-drain")
        with pytest.raises(httpx.ConnectError):  # new connections go to the other replicas
            await client.get("/health")
        await stopping
    assert not gw.http.healthy()
