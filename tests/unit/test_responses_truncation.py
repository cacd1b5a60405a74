"""`truncation: "auto"` through the real app (harness: tests/unit/gateway_harness.py): workers whose
engine double counts a token per word and refuses a prompt over its 64-token context
(CONTEXT_TOO_LONG, as the real servicer does), over an in-process memory state service."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from services.gateway.admission.admission import Ticket
from services.gateway.responses.conversation import item_dict
from services.gateway.responses.protocol import parse_response_request, to_infer_request
from services.gateway.responses.protocol_events import ResponseStreamEncoder
from services.gateway.responses.protocol_items import to_messages
from services.gateway.responses.truncation import open_fitting
from services.gateway.responses.turns import Turn
from tests.engine_double import ServedWorker
from tests.unit.gateway_harness import MODEL

pytest_plugins = ("tests.unit.gateway_fixtures",)  # its fixtures: gateway, workers (64-token context), client
pytestmark = pytest.mark.timeout(60)


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def msg(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


# 3 + 20 + 10 + 10 + 10 + 5 + 8 words, and "Be brief." (2): 68 tokens for a 64-token context
CONVERSATION = [
    msg("developer", words("d", 3)),
    msg("user", words("u1_", 20)),
    {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": words("o", 10)},
    msg("assistant", words("a1_", 10)),
    msg("user", words("u2_", 10)),
    msg("assistant", words("a2_", 5)),
    msg("user", words("u3_", 8)),
]
# the first exchange goes whole (its call with its output); the developer message stays
SHOWN = ["Be brief.", words("d", 3), words("u2_", 10), words("a2_", 5), words("u3_", 8)]


def renders(workers: tuple[ServedWorker, ...]) -> list[list[str]]:
    """The message contents of every prompt the engines rendered since the last call (in no order
    across the two replicas)."""
    out = [[m["content"] for m in r.messages or []] for w in workers for r in w.engine.renders]
    for w in workers:
        w.engine.renders.clear()
    return out


async def create(client: httpx.AsyncClient, stream: bool = False, **body: Any) -> dict[str, Any]:
    """The response (a streamed one: from its one terminal event); fails on an error status."""
    payload = {"model": MODEL, "instructions": "Be brief.", **body}
    if not stream:
        r = await client.post("/v1/responses", json=payload)
        assert r.status_code == 200, r.text
        return r.json()
    async with client.stream("POST", "/v1/responses", json={**payload, "stream": True}) as s:
        assert s.status_code == 200, await s.aread()
        events = [json.loads(line[6:]) async for line in s.aiter_lines() if line.startswith("data: {")]
    assert [e["type"] for e in events].count("response.created") == 1
    assert events[-1]["type"] == "response.completed", events[-1]
    return events[-1]["response"]


@pytest.mark.parametrize("stream", [False, True])
async def test_auto_leaves_out_the_oldest_exchange_and_stores_what_was_shown(responses, workers, client, stream):
    """Once accepted and echoed, then a 400 context_length_exceeded as with "disabled"."""
    r = await client.post("/v1/responses", json={"model": MODEL, "instructions": "Be brief.", "input": CONVERSATION})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (
        400, "context_length_exceeded", "input"), r.text
    assert len(renders(workers)) == 1
    response = await create(client, stream, input=CONVERSATION, truncation="auto")
    assert (response["status"], response["truncation"]) == ("completed", "auto")
    assert sorted(map(len, seen := renders(workers))) == [len(SHOWN), 1 + len(CONVERSATION)]
    assert SHOWN in seen  # refused once, then shown the rest
    items = (await client.get(f"/v1/responses/{response['id']}/input_items", params={"order": "asc"})).json()
    assert len(items["data"]) == len(CONVERSATION)  # the request's input, all of it
    # The stored conversation is what the model was shown: continuing it fits without truncation.
    after = await create(client, stream, input="and then", previous_response_id=response["id"])
    assert after["truncation"] == "disabled"
    assert renders(workers) == [[*SHOWN, "Hello world!", "and then"]]


async def test_a_background_run_is_truncated_too(responses, workers, client):
    r = await client.post("/v1/responses", json={"model": MODEL, "instructions": "Be brief.", "input": CONVERSATION,
                                                 "truncation": "auto", "background": True})
    assert r.status_code == 200, r.text
    async with client.stream("GET", f"/v1/responses/{r.json()['id']}", params={"stream": "true"}) as s:
        events = [json.loads(line[6:]) async for line in s.aiter_lines() if line.startswith("data: {")]
    assert events[-1]["type"] == "response.completed", events[-1]
    assert SHOWN in renders(workers)


async def test_auto_refuses_when_only_the_last_user_message_is_left(responses, workers, client):
    for body in ({"input": words("w", 70)},
                 {"input": [msg("assistant", words("a", 5)), msg("user", words("u", 70))]}):
        r = await client.post("/v1/responses", json={"model": MODEL, "truncation": "auto", **body})
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (
            400, "context_length_exceeded", "input"), r.text
    assert sum(len(w.engine.started) for w in workers) == 0


class Refunds:
    """The admission's side of a ticket: what each settlement gives back."""

    def __init__(self) -> None:
        self.given_back: list[int] = []

    def adjust_later(self, key: str, limit: int, delta: int) -> None:
        self.given_back.append(delta)


async def test_a_refused_attempt_keeps_the_reservation_for_the_next(gateway, workers):
    """The reservation is settled once, by the generation that ran, with what it used (a refused
    attempt settling it would give it all back, and the run that follows would be free)."""
    admission = Refunds()
    req = parse_response_request({"model": MODEL, "input": CONVERSATION, "truncation": "auto"})
    inputs = [item_dict(i) for i in req.input_items]
    encoder = ResponseStreamEncoder.for_request(req)
    turn = Turn(req, "me", [], inputs, encoder, to_infer_request(req, to_messages(None, [], inputs),
                                                                 request_id=encoder.id, cache_salt=None),
                Ticket(admission, key="k", limit=1000, reserved=500, prompt_estimate=20))  # type: ignore[arg-type]

    async def run() -> None:
        generation = await open_fitting(gateway.table, turn, turn.infer, turn.ticket)
        try:
            assert admission.given_back == []
            async for _ in generation:
                pass
        finally:
            generation.close()
    assert gateway.http.loop is not None  # the table's channels live on the server's loop
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), gateway.http.loop))
    used = 3 + 10 + 5 + 8 + 3  # the prompt shown (the developer message, the last two exchanges), the output
    assert turn.dropped == {1, 2, 3, 4} and admission.given_back == [500 - used]
