"""`/v1/responses` through the real app over real sockets (harness: tests/unit/gateway_harness.py),
with an in-process state service (memory store) and worker replicas around the engine double.
Every object the edge emits here (responses, compaction results, stream events, WebSocket
messages) is checked against the saved Open Responses schema (tests/openresponses.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.helpers import until
from tests.openresponses import check_compaction, check_events, check_response, check_socket_turn
from tests.unit.gateway_harness import MODEL

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, workers, client
pytestmark = pytest.mark.timeout(60)
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture
def max_model_len() -> int:
    return 1024  # compaction asks for a 256-token summary


async def create(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": MODEL, **body})


async def test_responses_and_their_events_follow_the_spec(responses, workers, client):
    r = await create(client, input="say hi")
    assert r.status_code == 200, r.text
    check_response(r.json())
    check_response((await client.get(f"/v1/responses/{r.json()['id']}")).json())
    async with client.stream("POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}) as s:
        lines = [line async for line in s.aiter_lines()]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    check_events(events)
    assert [line for line in lines if line][-1] == "data: [DONE]"


async def test_compaction_results_follow_the_spec(responses, workers, client):
    first = await create(client, input="remember the word blue")
    assert first.status_code == 200, first.text
    r = await client.post("/v1/responses/compact", json={"model": MODEL, "previous_response_id": first.json()["id"],
                                                          "input": [{"role": "user", "content": "and red"}]})
    assert r.status_code == 200, r.text
    compacted = check_compaction(r.json())
    assert [i["type"] for i in compacted["output"]] == ["message", "message", "compaction"]
    assert all(i["status"] == "completed" for i in compacted["output"] if i["type"] == "message")


async def test_an_output_for_no_call_fails_the_turn(responses, workers, client):
    stray = {"type": "function_call_output", "call_id": "call_nope", "output": "42"}
    r = await create(client, input=[{"role": "user", "content": "hi"}, stray])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", "input[1].call_id")
    assert "call_nope" in err["message"]
    previous = await create(client, input="hi")
    r = await create(client, input=[stray], previous_response_id=previous.json()["id"])
    assert (r.status_code, r.json()["error"]["param"]) == (400, "input[0].call_id")


async def socket_turn(ws: ClientConnection, **body: Any) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "response.create", "model": MODEL, **body}))
    messages: list[dict[str, Any]] = []
    while not messages or not (messages[-1]["type"] in TERMINAL or "status" in messages[-1]):
        messages.append(json.loads(await ws.recv()))
    check_socket_turn(messages)
    return messages


async def test_a_failed_socket_continuation_evicts_its_parent(responses, workers, gateway):
    async with connect(f"ws://127.0.0.1:{gateway.http.port}/v1/responses") as ws:
        first = await socket_turn(ws, input="hi", store=False)
        rid = first[-1]["response"]["id"]
        stray = {"type": "function_call_output", "call_id": "call_nope", "output": "42"}
        failed = await socket_turn(ws, input=[stray], store=False, previous_response_id=rid)
        assert (failed[-1]["status"], failed[-1]["error"]["param"]) == (400, "input[0].call_id")
        gone = await socket_turn(ws, input="again", store=False, previous_response_id=rid)
        assert gone[-1]["error"]["code"] == "previous_response_not_found"
        refused = await socket_turn(ws, input="x", stream=True)  # an error without a code still has one
        assert refused[-1]["error"]["param"] == "stream"


async def test_a_client_that_leaves_after_response_created_releases_the_worker_call(responses, workers, client):
    """The engine parks before its last chunk; the client reads `response.created` and hangs up.
    The workers fixture then requires every endpoint count back at 0 and both workers idle."""
    for w in workers:
        w.engine.hold.clear()
    async with client.stream("POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}) as s:
        async for line in s.aiter_lines():
            if line.startswith("data: {"):
                assert json.loads(line[6:])["type"] == "response.created"
                break


async def test_a_socket_closed_after_response_created_releases_the_worker_call(responses, workers, gateway):
    for w in workers:
        w.engine.hold.clear()
    async with connect(f"ws://127.0.0.1:{gateway.http.port}/v1/responses") as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
        assert json.loads(await ws.recv())["type"] == "response.created"


async def test_a_socket_that_sent_another_message_mid_turn_then_hung_up_releases_the_worker_call(
        responses, workers, gateway):
    """The next message waits for the turn; the socket is still watched meanwhile, so a hang-up
    after it cancels the turn (the workers fixture requires the worker calls released)."""
    for w in workers:
        w.engine.hold.clear()
    async with connect(f"ws://127.0.0.1:{gateway.http.port}/v1/responses") as ws:
        create = json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False})
        await ws.send(create)
        assert json.loads(await ws.recv())["type"] == "response.created"
        await ws.send(create)  # mid-turn
    await until(lambda: any(w.engine.cancelled for w in workers), "the turn's engine request cancelled")


async def test_messages_sent_mid_turn_are_answered_in_order_after_it(responses, workers, gateway):
    async with connect(f"ws://127.0.0.1:{gateway.http.port}/v1/responses") as ws:
        for text in ("one", "two"):
            await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": text, "store": False}))
        ids = []
        while len(ids) < 2:
            event = json.loads(await ws.recv())
            if event["type"] in TERMINAL:
                ids.append(event["response"]["id"])
        assert len(set(ids)) == 2


async def test_an_id_longer_than_the_store_holds_is_404_not_500(responses, workers, client):
    """Found by the edge fuzz run: the state service refuses keys over 512 bytes (INVALID_ARGUMENT)."""
    long_id = "resp_" + "A" * 1000
    for method, path in (("GET", f"/v1/responses/{long_id}"), ("DELETE", f"/v1/responses/{long_id}"),
                         ("POST", f"/v1/responses/{long_id}/cancel"), ("GET", f"/v1/responses/{long_id}/input_items")):
        r = await client.request(method, path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", (method, path, r.text)
    r = await create(client, input="hi", previous_response_id=long_id)
    assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
