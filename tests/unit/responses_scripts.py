"""Requests and scripted worker turns for the `/v1/responses` protocol tests."""

from __future__ import annotations

from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.responses.protocol import ResponseRequest, parse_response_request
from services.gateway.responses.protocol_events import ResponseAssembler, ResponseStreamEncoder
from tests.unit.worker_events import LENGTH, STOP, TOOLS, call, delta, final

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}

TEXT = [delta("Hello"), delta(", world"), final(STOP)]
THINKING = [delta(reasoning="Let me "), delta(reasoning="think."), delta("4"), delta("2"), final(STOP, reasoning=3)]
TOOL_CALLS = [delta(calls=[call(0, '{"city": ', id="call_a", name="get_weather")]),
              delta(calls=[call(0, '"Paris"}')]),
              delta(calls=[call(1, "{}", id="call_b", name="get_time")]), final(TOOLS)]
TRUNCATED = [delta("Once upon"), delta(" a time"), final(LENGTH)]
BROKEN = [delta("Half an ans"), final(pb.FINISH_REASON_ERROR)]


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": "hi", **kw}


def request(**kw: Any) -> ResponseRequest:
    return parse_response_request(body(**kw))


def stream(events: list[pb.InferEvent], *, start: int = 0, **kw: Any) -> tuple[ResponseStreamEncoder, list]:
    enc = ResponseStreamEncoder.for_request(request(**kw), sequence_number=start)
    out = enc.start()
    for event in events:
        out += enc.encode(event)
    return enc, out


def assemble(events: list[pb.InferEvent], **kw: Any) -> dict[str, Any]:
    asm = ResponseAssembler.for_request(request(**kw), response_id="resp_1", created_at=123)
    for event in events:
        asm.add(event)
    return asm.result()
