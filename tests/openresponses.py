"""The Open Responses schema (tests/data/openresponses) and the openai SDK's types, as checks that
every response object and stream event we produce must pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

SPEC = json.loads((Path(__file__).parent / "data" / "openresponses" / "openapi.json").read_text())
_COMPONENTS = {"components": SPEC["components"]}
_STREAM = SPEC["paths"]["/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
RESPONSE_SCHEMA = Draft202012Validator({"$ref": "#/components/schemas/ResponseResource", **_COMPONENTS})
EVENT_SCHEMA = Draft202012Validator({**_STREAM, **_COMPONENTS})
CREATE_SCHEMA = Draft202012Validator({"$ref": "#/components/schemas/CreateResponseBody", **_COMPONENTS})
COMPACTION_SCHEMA = Draft202012Validator({"$ref": "#/components/schemas/CompactResource", **_COMPONENTS})
_SOCKET = SPEC["paths"]["/responses"]["x-openresponses-websocket"]
WS_ERROR_SCHEMA = Draft202012Validator({**_SOCKET["errorMessage"], **_COMPONENTS})
SDK_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TERMINALS = {"response.completed", "response.incomplete", "response.failed"}


def spec_errors(validator: Draft202012Validator, obj: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in validator.iter_errors(obj)]


def check_response(obj: dict[str, Any]) -> Response:
    """Valid for the spec's ResponseResource and for the openai SDK's Response."""
    assert spec_errors(RESPONSE_SCHEMA, obj) == []
    return Response.model_validate(obj)


def check_events(events: list[dict[str, Any]], start: int = 0) -> list[Any]:
    """Each event valid for the spec's stream union and the SDK's; numbered from `start` with no
    gaps; exactly one terminal event, last; and the SDK's own stream helper accepts the sequence."""
    parsed = []
    for event in events:
        assert spec_errors(EVENT_SCHEMA, event) == [], event["type"]
        parsed.append(SDK_EVENT.validate_python(event))
    assert [e["sequence_number"] for e in events] == list(range(start, start + len(events)))
    assert [e["type"] in TERMINALS for e in events].count(True) == 1 and events[-1]["type"] in TERMINALS
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in parsed:
        state.handle_event(event)
    return parsed


def check_compaction(obj: dict[str, Any]) -> dict[str, Any]:
    """Valid for the spec's CompactResource (what `/v1/responses/compact` returns)."""
    assert spec_errors(COMPACTION_SCHEMA, obj) == []
    return obj


def check_socket_turn(messages: list[dict[str, Any]]) -> list[Any]:
    """One WebSocket turn's messages: a refused turn is one spec WebSocketErrorEvent; any other
    turn is an event stream that passes `check_events` (its numbering starts at 0)."""
    if len(messages) == 1 and messages[0]["type"] == "error" and "status" in messages[0]:
        assert spec_errors(WS_ERROR_SCHEMA, messages[0]) == []
        return messages
    return check_events(messages)
