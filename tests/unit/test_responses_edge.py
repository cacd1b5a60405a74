"""`/v1/responses` at the HTTP edge (harness: tests/unit/gateway_harness.py, with an in-process state
service): client JSON the answers echo (tool schemas, input items) that orjson refuses, written by
the fallback of `encode_json`; worker refusals named as the Responses API names the field (the
name table itself: tests/unit/test_gateway_errors.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from services.gateway.edge.json_response import encode_json
from tests.unit.gateway_harness import MODEL, Gateway

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: workers, client
pytestmark = pytest.mark.timeout(60)

BIG = 10**20  # beyond 64 bits: the stdlib parser takes it, orjson refuses to write it
BIG_TOOL = {"type": "function", "name": "f",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": BIG}}}}


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        value = {"a": value}
    return value


# ---- encode_json -------------------------------------------------------------------------------

def test_encode_json_writes_what_orjson_refuses_as_the_stdlib_would():
    value = {"maximum": BIG, "minimum": -BIG, "text": "é ✓ \"q\" \\ \n \u2028", "n": [1, 2.5, None, True], 7: "k"}
    for refused in (value, nested(300)):
        with pytest.raises(orjson.JSONEncodeError):
            orjson.dumps(refused, option=orjson.OPT_NON_STR_KEYS)
        assert encode_json(refused) == json.dumps(refused, ensure_ascii=False, separators=(",", ":")).encode()
    deeper = nested(5000)  # deeper than the recursion limit: written without recursion
    assert encode_json(deeper) == b'{"a":' * 5000 + b'{"type":"object"}' + b"}" * 5000


def test_encode_json_fallback_keeps_orjsons_shape():
    assert encode_json({"n": float("nan"), "i": [float("inf")], "big": BIG}) == b'{"n":null,"i":[null],"big":%d}' % BIG
    assert orjson.dumps({"n": float("nan")}) == b'{"n":null}'
    assert json.loads(encode_json({"s": "\ud800", "big": BIG})) == {"s": "\ud800", "big": BIG}  # escaped
    common = {"id": "c1", "choices": [{"delta": {"content": "hé"}}], "usage": None, 1: 2}
    assert encode_json(common) == orjson.dumps(common, option=orjson.OPT_NON_STR_KEYS)


# ---- end to end --------------------------------------------------------------------------------

@pytest.fixture
def max_model_len() -> int:
    return 1024


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    gw = Gateway(max_body_bytes=2**20)
    yield gw
    await gw.stop()


async def test_echoed_json_orjson_refuses_is_answered_whole(responses, workers, client, gateway):
    deep = {"type": "function", "name": "g", "parameters": nested(260)}
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": [BIG_TOOL, deep]})
    assert r.status_code == 200, r.text
    assert r.json()["tools"][0]["parameters"]["properties"]["n"]["maximum"] == BIG
    assert r.json()["tools"][1]["parameters"] == nested(260)

    async with client.stream("POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True,
                                                            "tools": [BIG_TOOL]}) as s:
        lines = [line async for line in s.aiter_lines() if line]
    assert s.status_code == 200 and lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["type"] == "response.completed"

    async with connect(f"ws://127.0.0.1:{gateway.http.port}/v1/responses") as ws:  # stored, then read over HTTP
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "tools": [BIG_TOOL]}))
        while (m := json.loads(await ws.recv()))["type"] != "response.completed":
            pass
    r = await client.get(f"/v1/responses/{m['response']['id']}")
    assert r.status_code == 200 and r.json()["tools"][0]["parameters"] == BIG_TOOL["parameters"]

    item = {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "x", "annotations": [{"n": BIG}]}]}
    r = await client.post("/v1/responses", json={"model": MODEL, "input": [item, {"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    r = await client.get(f"/v1/responses/{r.json()['id']}/input_items")
    assert r.status_code == 200 and BIG in [a["n"] for i in r.json()["data"] for c in i.get("content", [])
                                            for a in c.get("annotations", [])]


async def test_a_worker_refusal_names_the_responses_field(responses, workers, client):
    r = await client.post("/v1/responses", json={"model": MODEL, "input": []})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {"message": "input must not be empty", "type": "invalid_request_error",
                                 "param": "input", "code": "invalid_value"}
