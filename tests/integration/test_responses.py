"""`/v1/responses` on the real platform (Ray, Serve, vLLM, Redis-backed state): every response
object and event is checked against the Open Responses schema and the official openai SDK."""

from __future__ import annotations

import json
import time

import grpc
import httpx
import openai
import pytest
from websockets.sync.client import connect

from mship.worker.v1 import worker_pb2_grpc
from services.worker.builtin import corpus
from tests.integration.test_platform import worker_address
from tests.openresponses import check_compaction, check_events, check_response, check_socket_turn
from tests.platform_process import PlatformProcess
from tests.worker_calls import wait_load

pytestmark = pytest.mark.integration
KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"
FRANCE = "What is the capital of France?"


def sdk(platform: PlatformProcess, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)


def http(platform: PlatformProcess, key: str = KEY_A) -> httpx.Client:
    return httpx.Client(base_url=f"{platform.base_url}/v1", headers={"authorization": f"Bearer {key}"}, timeout=120)


def create(platform: PlatformProcess, key: str = KEY_A, **body) -> dict:
    with http(platform, key) as c:
        r = c.post("/responses", json={"model": "tiny", "max_output_tokens": 64, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    check_response(r.json())
    return r.json()


def sse_events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def text_of(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])


def test_create_retrieve_list_delete_with_the_sdk(platform):
    client = sdk(platform)
    response = client.responses.create(model="tiny", input=FRANCE, max_output_tokens=64, temperature=0,
                                       metadata={"case": "crud"})
    assert response.status == "completed" and response.output_text == corpus.FIXED_ANSWERS[FRANCE]
    assert response.usage.input_tokens > 0 and response.usage.input_tokens_details.cached_tokens is not None
    assert client.responses.retrieve(response.id).output_text == response.output_text
    items = client.responses.input_items.list(response.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == FRANCE
    assert client.responses.delete(response.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_streamed_events_follow_the_spec(platform):
    with http(platform) as c, c.stream("POST", "/responses", json={
            "model": "tiny", "input": "Tell me a story.", "stream": True, "temperature": 0}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    check_events(events)
    assert events[-1]["type"] == "response.completed"
    assert text_of(events[-1]["response"]) == corpus.FIXED_ANSWERS["Tell me a story."]
    with sdk(platform).responses.stream(model="tiny", input=FRANCE, temperature=0) as stream:
        assert stream.get_final_response().output_text == corpus.FIXED_ANSWERS[FRANCE]


def test_chains_branches_and_deleted_parents(platform):
    first = create(platform, input=FRANCE)
    short = create(platform, input="hi", previous_response_id=first["id"])
    long = create(platform, input="hello there, here is a much longer message " * 4,
                  previous_response_id=first["id"])
    assert short["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    on_short = create(platform, input="What is 2 + 2?", previous_response_id=short["id"])
    on_long = create(platform, input="What is 2 + 2?", previous_response_id=long["id"])
    # each branch carries its own history only
    assert on_long["usage"]["input_tokens"] - on_short["usage"]["input_tokens"] == \
        long["usage"]["input_tokens"] - short["usage"]["input_tokens"]
    with http(platform) as c:
        assert c.delete(f"/responses/{first['id']}").json()["deleted"] is True
        assert c.get(f"/responses/{first['id']}").status_code == 404
    again = create(platform, input="What is 2 + 2?", previous_response_id=short["id"])
    assert again["usage"]["input_tokens"] == on_short["usage"]["input_tokens"]  # the parent's loss broke nothing


def test_another_identity_sees_nothing(platform):
    mine = create(platform, input=FRANCE)
    with http(platform, KEY_B) as other:
        r = other.get(f"/responses/{mine['id']}")
        assert r.status_code == 404 and FRANCE not in r.text
        r = other.post("/responses", json={"model": "tiny", "input": "x", "previous_response_id": mine["id"]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
        assert other.get(f"/responses/{mine['id']}/input_items").status_code == 404


def test_tool_call_round_trip(platform):
    tool = {"type": "function", **corpus.WEATHER_TOOL["function"]}
    first = create(platform, input=corpus.TOOL_PROMPT, tools=[tool])
    (call,) = [item for item in first["output"] if item["type"] == "function_call"]
    assert (call["name"], json.loads(call["arguments"])) == (corpus.EXPECTED_TOOL_CALL["name"],
                                                             corpus.EXPECTED_TOOL_CALL["arguments"])
    second = create(platform, tools=[tool], previous_response_id=first["id"], input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": corpus.TOOL_RESULT}])
    assert text_of(second) == corpus.TOOL_RESULT_ANSWER


def test_reasoning_item_and_incomplete(platform):
    response = create(platform, input=corpus.THINK_PROMPT, max_output_tokens=128)
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message"] and text_of(response) == corpus.EXPECTED_THINK_ANSWER
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    cut = create(platform, input="Tell me a story.", max_output_tokens=16)
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_background_poll_cancel_and_the_engine_stops(platform):
    client = sdk(platform)
    for _ in range(5):  # cancel right after create; retry in the rare case the run finished first
        queued = client.responses.create(model="tiny", input="Tell me a story.", background=True,
                                         max_output_tokens=900, temperature=0)
        assert queued.status == "queued" and queued.background is True
        cancelled = client.responses.cancel(queued.id)
        if cancelled.status == "cancelled":
            break
        assert cancelled.status == "completed"  # it had finished: a cancel leaves it as it is
    else:
        pytest.fail("every background run finished before its cancel")
    async with grpc.aio.insecure_channel(worker_address(platform)) as channel:
        await wait_load(worker_pb2_grpc.WorkerStub(channel),
                        lambda r: r.running_requests == 0 and r.inflight_calls == 0, 2.0)
    assert client.responses.retrieve(queued.id).status == "cancelled"  # it sticks
    assert client.responses.cancel(queued.id).status == "cancelled"


def test_background_stream_resumes_exactly_once(platform):
    body = {"model": "tiny", "input": "Tell me a story.", "background": True, "stream": True, "temperature": 0,
            "max_output_tokens": 64}
    with http(platform) as c:
        with c.stream("POST", "/responses", json=body) as r:
            head = []
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    head.append(json.loads(line[6:]))
                if len(head) == 6:
                    break  # the client goes away mid-stream; the run goes on
        k = head[-1]["sequence_number"]
        with c.stream("GET", f"/responses/{head[0]['response']['id']}",
                      params={"stream": "true", "starting_after": k}) as r:
            rest = sse_events(r.iter_lines())
    assert rest[0]["sequence_number"] == k + 1
    check_events(head + rest)
    assert text_of(rest[-1]["response"]) == corpus.FIXED_ANSWERS["Tell me a story."]


def test_bad_inputs_are_4xx(platform):
    with http(platform) as c:
        cases = [
            ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
            ({"input": "x", "background": True, "store": False}, 400, "background"),
            ({"input": [{"type": "message", "role": "wizard", "content": "x"}]}, 400, "input[0].role"),
            ({"input": "hello " * 1500}, 400, "input"),
            ({"input": "x", "frobnicate": 1}, 400, "frobnicate"),
        ]
        for body, status, param in cases:
            r = c.post("/responses", json={"model": "tiny", **body})
            assert (r.status_code, r.json()["error"]["param"]) == (status, param), r.text
        assert c.post("/responses/compact", json={"input": "x"}).status_code == 400


def test_compaction_starts_a_new_chain(platform):
    first = create(platform, input=FRANCE)
    second = create(platform, input="What is 2 + 2?", previous_response_id=first["id"])
    with http(platform) as c:
        r = c.post("/responses/compact", json={"model": "tiny", "previous_response_id": second["id"]})
    assert r.status_code == 200, r.text
    compacted = check_compaction(r.json())
    assert compacted["object"] == "response.compaction"
    assert [i["type"] for i in compacted["output"]] == ["message", "message", "compaction"]
    follow = create(platform, input=[*compacted["output"], {"type": "message", "role": "user",
                                                            "content": "What color is the sky?"}])
    assert follow["status"] == "completed"
    tampered = {**compacted["output"][-1], "encrypted_content": "AAAA" + compacted["output"][-1]["encrypted_content"]}
    with http(platform) as c:
        assert c.post("/responses", json={"model": "tiny", "input": [tampered]}).status_code == 400


def test_websocket_mode(platform):
    url = f"ws://127.0.0.1:{platform.http_port}/v1/responses"
    headers = {"authorization": f"Bearer {KEY_A}"}

    def turn(ws, **body) -> list[dict]:
        ws.send(json.dumps({"type": "response.create", "model": "tiny", "temperature": 0, **body}))
        events = []
        while not events or events[-1]["type"] not in ("response.completed", "response.incomplete",
                                                         "response.failed", "error"):
            events.append(json.loads(ws.recv(timeout=120)))
        check_socket_turn(events)
        return events

    with connect(url, additional_headers=headers) as ws:
        first = turn(ws, input=FRANCE, store=False)
        check_events(first)
        rid = first[-1]["response"]["id"]
        second = turn(ws, input="What is 2 + 2?", store=False, previous_response_id=rid)
        assert second[-1]["type"] == "response.completed" and text_of(second[-1]["response"]) == "2 + 2 = 4."
        assert second[-1]["response"]["usage"]["input_tokens"] > first[-1]["response"]["usage"]["input_tokens"]
        rid2 = second[-1]["response"]["id"]
        failed = turn(ws, input="hello " * 1500, store=False, previous_response_id=rid2)  # over the context
        assert failed[-1]["type"] == "error" and failed[-1]["status"] == 400
        gone = turn(ws, input="x", store=False, previous_response_id=rid2)  # its continuation just failed
        assert gone[-1]["error"]["code"] == "previous_response_not_found"
    with connect(url, additional_headers=headers) as other:  # store:false ids live on their socket only
        assert turn(other, input="x", previous_response_id=rid)[-1]["error"]["code"] == "previous_response_not_found"
        assert turn(other, input="x", stream=True)[-1]["error"]["param"] == "stream"


def test_durable_across_state_and_gateway_restarts(platform):
    stored = create(platform, input=FRANCE)
    child = create(platform, input="What is 2 + 2?", previous_response_id=stored["id"])
    with http(platform) as c:
        bg = c.post("/responses", json={"model": "tiny", "input": "hi", "background": True, "temperature": 0}).json()
        deadline = time.monotonic() + 60
        while c.get(f"/responses/{bg['id']}").json()["status"] not in ("completed", "incomplete"):
            assert time.monotonic() < deadline
    before = {rid: sdk(platform).responses.retrieve(rid).model_dump() for rid in (stored["id"], child["id"], bg["id"])}
    for fragment in ("StateDeployment", "GatewayDeployment"):
        for proc in platform.find(fragment):
            proc.kill()
    deadline = time.monotonic() + 180
    back: set[str] = set()
    while len(back) < 2:  # Serve brings them back: both gateway replicas answer from the store again
        try:
            with http(platform) as c:  # a new connection each time: the kernel spreads them over replicas
                r = c.get(f"/responses/{stored['id']}")
                if r.status_code == 200:
                    back.add(r.headers["x-mship-gateway"])
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"gateway/state did not come back (answered: {back})"
        time.sleep(0.2)
    after = {rid: sdk(platform).responses.retrieve(rid).model_dump() for rid in before}
    assert after == before
    assert create(platform, input="What color is the sky?", previous_response_id=child["id"])["status"] == "completed"


def test_a_run_whose_gateway_died_is_reported_failed(platform):
    with http(platform) as c:
        queued = c.post("/responses", json={"model": "tiny", "input": "Tell me a story.", "background": True,
                                            "max_output_tokens": 900, "temperature": 0}).json()
        deadline = time.monotonic() + 60
        while c.get(f"/responses/{queued['id']}").json()["status"] != "in_progress":
            assert time.monotonic() < deadline
    for proc in platform.find("GatewayDeployment"):  # the replica running it dies (with its peer)
        proc.kill()
    client = sdk(platform)
    deadline = time.monotonic() + 120
    while True:  # the owner lease runs out; the state service reports the run failed, not in progress
        try:
            status = client.responses.retrieve(queued["id"]).status
        except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
            status = None
        if status == "failed":
            break
        assert status in (None, "in_progress") and time.monotonic() < deadline, status
        time.sleep(0.5)
    with http(platform) as c, c.stream("GET", f"/responses/{queued['id']}", params={"stream": "true"}) as r:
        events = sse_events(r.iter_lines())
    assert events[-1]["type"] == "response.failed"  # a follower of the log ends too
