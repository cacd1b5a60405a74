"""`/v1/responses` against its state service, through the real app (harness:
tests/unit/gateway_harness.py): what a client gets when the service is down, when a background
response is deleted under its follower, when a conversation outgrows the store, and for a resume
point no log can hold. Each refusal comes before any engine work."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest

from mship.state.v1 import state_pb2 as spb
from services.common.errors import ErrorDetails
from services.gateway.identity import ANONYMOUS
from services.gateway.responses import conversation
from services.gateway.responses.compaction import CompactionCodec
from services.gateway.responses.router import enable_responses
from services.gateway.responses.serving import ResponsesServing
from services.state.client import StateClient, StateError
from services.state.deployment import start_state_server
from tests.helpers import until
from tests.unit.gateway_harness import MODEL, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, workers, client
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def max_model_len() -> int:
    return 1024


async def serve_responses(gateway: Gateway, port: int) -> ResponsesServing:
    def enable() -> ResponsesServing:  # on the server's loop: the state client's channel lives there
        serving = ResponsesServing(gateway.table, StateClient(f"127.0.0.1:{port}"), "gw-test", CompactionCodec())
        enable_responses(gateway.app, serving)
        return serving
    return await gateway.on_loop(enable)


@pytest.fixture(scope="module")
async def state_port() -> AsyncIterator[int]:
    server, port = await start_state_server("memory://", "127.0.0.1", 0, sweep_interval_s=None)
    yield port
    await server.stop(0)


@pytest.fixture(scope="module")
async def responses(gateway: Gateway, state_port: int) -> AsyncIterator[ResponsesServing]:
    yield await serve_responses(gateway, state_port)
    await gateway.on_loop(lambda: enable_responses(gateway.app, None))


def generations(workers) -> Callable[[], int]:
    """How many generations the engines have started since this was called."""
    before = sum(len(w.engine.started) for w in workers)
    return lambda: sum(len(w.engine.started) for w in workers) - before


async def create(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": MODEL, **body})


def error_of(r: httpx.Response) -> tuple[int, str | None, str | None]:
    err = r.json()["error"]
    return r.status_code, err["param"], err["code"]


@pytest.mark.parametrize("after", ["-5", "-1", str(2**63), str(2**64)])
async def test_a_resume_point_no_log_holds_is_400_before_the_stream(responses, workers, client, after):
    """Once, a 200 went out and then the stream broke (ValueError: the proto's uint64)."""
    rid = (await create(client, input="hi", background=True)).json()["id"]
    r = await client.get(f"/v1/responses/{rid}?stream=true&starting_after={after}")
    assert error_of(r) == (400, "starting_after", None), r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and after in r.json()["error"]["message"]
    await until(lambda: not responses._runs.tasks, "the background run to finish")


async def test_a_follower_of_a_deleted_response_is_told_it_is_gone(responses, workers, client):
    for w in workers:
        w.engine.hold.clear()
    try:
        rid = (await create(client, input="hi", background=True)).json()["id"]
        seen: list[dict[str, Any]] = []
        async with client.stream("GET", f"/v1/responses/{rid}?stream=true&starting_after=0") as s:
            async for line in s.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                seen.append(json.loads(line[6:]))
                if len(seen) == 1:  # response.in_progress: the run waits in the engine
                    assert (await client.delete(f"/v1/responses/{rid}")).status_code == 200
    finally:
        for w in workers:
            w.engine.hold.set()
    *sent, error = seen
    assert [e["sequence_number"] for e in sent] == list(range(1, len(sent) + 1))
    assert error["type"] == "error" and error["sequence_number"] == sent[-1]["sequence_number"] + 1
    assert (error["code"], error["param"], error["error"]["type"]) == ("response_not_found", "response_id",
                                                                       "invalid_request_error")


async def test_a_conversation_too_large_to_store_is_refused_before_engine_work(responses, state_port, workers,
                                                                              client, monkeypatch):
    """Found with a snapshot over the state service's 64 MiB message limit: a 500 after generation."""
    monkeypatch.setattr(conversation, "MAX_SNAPSHOT_BYTES", 3 * 1024)  # the harness's bodies are at most 2 KiB
    monkeypatch.setattr(conversation, "OUTPUT_ALLOWANCE", 256)
    ran = generations(workers)
    r = await create(client, input="x" * 1500)  # twice in the snapshot: the conversation, the input items
    assert error_of(r) == (400, "input", "conversation_too_large"), r.text
    assert "/v1/responses/compact" in r.json()["error"]["message"]
    long = [{"type": "message", "role": "user", "id": f"msg_{i}", "content": [{"type": "input_text", "text": "y" * 99}]}
            for i in range(40)]  # a conversation that grew turn by turn (its outputs did)
    state = StateClient(f"127.0.0.1:{state_port}")
    try:
        await state.put_response(spb.StoredResponse(
            key=spb.ResponseKey(identity=ANONYMOUS, response_id="resp_long"), conversation_json=json.dumps(long),
            response_json=json.dumps({"id": "resp_long", "status": "completed"})))
    finally:
        await state.close()
    r = await create(client, input="more", previous_response_id="resp_long")
    assert error_of(r) == (400, "previous_response_id", "conversation_too_large"), r.text
    assert ran() == 0
    r = await create(client, input="more", previous_response_id="resp_long", store=False)  # not stored: no limit
    assert r.status_code == 200, r.text


async def test_an_input_items_cursor_naming_no_item_says_which(responses, workers, client):
    """Once: 400 "The request names something the response store cannot hold.", for any cursor."""
    rid = (await create(client, input="hi")).json()["id"]
    r = await client.get(f"/v1/responses/{rid}/input_items", params={"after": "msg_nope"})
    assert error_of(r) == (400, "after", None), r.text
    assert "no input item 'msg_nope' in this response" in r.json()["error"]["message"]


def test_a_snapshot_over_the_message_limit_is_413_not_500():
    err = conversation.store_error(StateError(ErrorDetails(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                           "Sent message larger than max")))
    assert (err.status, err.type, err.code) == (413, "invalid_request_error", "conversation_too_large")
async def test_a_state_service_known_to_be_down_is_503_before_engine_work(gateway, workers, client):
    server, port = await start_state_server("memory://", "127.0.0.1", 0, sweep_interval_s=None)
    serving = await serve_responses(gateway, port)
    try:
        assert (await create(client, input="hi")).status_code == 200
        await server.stop(0)
        ran = generations(workers)
        # The first request cannot know (no round trip is spent asking): its store call finds out.
        first = await create(client, input="hi")
        assert error_of(first) == (503, None, "store_unavailable")
        for _ in range(3):
            r = await create(client, input="hi")
            assert error_of(r) == (503, None, "store_unavailable") and r.headers["retry-after"] == "1"
        assert ran() == 1
        assert (await create(client, input="hi", store=False)).status_code == 200  # needs no store
        server, _ = await start_state_server("memory://", "127.0.0.1", port, sweep_interval_s=None)
        await until(lambda: not serving.state.known_down(), "the client to see the service back", timeout_s=10)
        assert (await create(client, input="hi")).status_code == 200
    finally:
        await gateway.on_loop(lambda: enable_responses(gateway.app, None))
        await server.stop(0)
