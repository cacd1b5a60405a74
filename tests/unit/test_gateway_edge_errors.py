"""The edge's errors end to end over real sockets (harness: tests/unit/gateway_harness.py): validation,
body limits, upstream failures before and after the first token, timeouts, and draining."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from mship.common.v1 import common_pb2
from tests.helpers import until
from tests.unit.gateway_harness import CHAT, MAX_BODY, MODEL, SERVER_ID, Gateway, served_by, sse

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, workers, client, oai
pytestmark = pytest.mark.timeout(60)


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

    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                 "/v1/audio/speech", "/v1/audio/transcriptions"):  # the POST-only routes
        r = await client.get(path)
        assert error_of(r, 405)["type"] == "invalid_request_error" and r.headers["allow"] == "POST", path
    assert served_by(*workers) == [0, 0]  # none of these reached a worker


async def test_a_body_that_is_not_utf8_is_invalid_json(workers, client):
    """UTF-16 hid a lone `\\ud800` from the surrogate check: a 500, or a stream cut after its 200."""
    for stream in (False, True):
        text = json.dumps({**CHAT, "stream": stream, "messages": [{"role": "user", "content": "hi \ud800"}]})
        assert "\\ud800" in text
        for body in (text.encode("utf-16"), json.dumps(CHAT).encode("utf-32")):
            r = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            err = error_of(r, 400)
            assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_json", None)
    assert served_by(*workers) == [0, 0]
    r = await client.post("/v1/chat/completions", content=b"\xef\xbb\xbf" + json.dumps(CHAT).encode(),
                          headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text  # a UTF-8 byte order mark is fine


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


async def test_all_replicas_overloaded_is_503_with_retry_after(workers, client, oai):
    for w in workers:
        w.servicer.gate.apply(common_pb2.ReplicaLimits())  # no engine place, no queue
    r = await client.post("/v1/chat/completions", json=CHAT)
    err = error_of(r, 503)
    assert (err["type"], err["code"], r.headers["retry-after"]) == ("server_error", "overloaded", "1")
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})  # before the first token
    assert error_of(r, 503)["code"] == "overloaded"
    with pytest.raises(openai.InternalServerError):
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
