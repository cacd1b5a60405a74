"""Chat and completions request bodies and their worker requests, for the protocol tests."""

from __future__ import annotations

from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.chat.protocol import parse_chat_request
from services.gateway.chat.protocol import to_infer_request as chat_to_infer
from services.gateway.completions.protocol import parse_completion_request
from services.gateway.completions.protocol import to_infer_request as completion_to_infer

USER = {"role": "user", "content": "hi"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [USER], **kw}


def chat_infer(**kw: Any) -> pb.InferRequest:
    return chat_to_infer(parse_chat_request(chat_body(**kw)), request_id="r1", cache_salt="salt")


def completion_infer(**kw: Any) -> pb.InferRequest:
    body = {"model": "tiny", "prompt": "Once", **kw}
    return completion_to_infer(parse_completion_request(body), request_id="r1", cache_salt=None)
