"""Conversations behind `previous_response_id`: stored snapshots and their resolution.

Each stored response is self-contained: its response object plus the whole conversation it ends
(every earlier input and output item, then its own). Continuing a chain reads one snapshot and
never the parent's parent, so deleting a parent breaks no child and concurrent continuations of
one parent are simply two snapshots (branches).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import grpc
from pydantic import BaseModel

from mship.state.v1 import state_pb2 as spb
from services.gateway.protocol_common.openai_error import OpenAIError
from services.state.client import NotFound, StateClient, StateError, Unavailable

FINISHED_OK = ("completed", "incomplete", "cancelled")


def item_dict(item: Any) -> dict[str, Any]:
    """A wire item as the JSON it is stored as, with an id (input items may come without)."""
    data = item.model_dump(mode="json", exclude_none=True) if isinstance(item, BaseModel) else dict(item)
    if "id" not in data:
        prefix = {"function_call_output": "fco", "function_call": "fc", "reasoning": "rs"}.get(data.get("type", ""),
                                                                                                "msg")
        data["id"] = f"{prefix}_{uuid.uuid4().hex}"
    if "role" in data and "type" not in data:
        data["type"] = "message"
    if data.get("type") == "message" and isinstance(data.get("content"), str):  # the canonical item form
        part = "output_text" if data.get("role") == "assistant" else "input_text"
        data["content"] = [{"type": part, "text": data["content"]}]
    return data


def previous_not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Previous response with id '{response_id}' not found.", param="previous_response_id",
                       code="previous_response_not_found")


def store_error(e: StateError) -> OpenAIError:
    """A state failure as the HTTP error the client sees (503 for an outage, before engine work; a
    key the store refuses, e.g. an id longer than any it holds, names no response: 404)."""
    if e.details.code == grpc.StatusCode.INVALID_ARGUMENT:
        fields = [f for f, _ in e.details.field_violations]
        if any(f.endswith("response_id") for f in fields):
            return OpenAIError(404, "Response not found.", param="response_id", code="response_not_found")
        return OpenAIError(400, "The request names something the response store cannot hold.",
                           param=fields[0].rsplit(".", 1)[-1] if fields else None)
    if isinstance(e, Unavailable):
        return OpenAIError(503, "The response store is unavailable; retry shortly.", type="server_error",
                           code="store_unavailable", headers={"Retry-After": "1"})
    return OpenAIError(500, "The response store failed.", type="server_error", code="store_error")


async def load_history(state: StateClient, identity: str, previous_id: str | None) -> list[dict[str, Any]]:
    """The conversation `previous_id` ended: its items, ready to continue from."""
    if not previous_id:
        return []
    try:
        snapshot = await state.get_response(identity, previous_id)
    except NotFound:
        raise previous_not_found(previous_id) from None
    except StateError as e:
        err = store_error(e)
        raise (previous_not_found(previous_id) if err.status == 404 else err) from e
    status = json.loads(snapshot.response_json).get("status")
    if snapshot.HasField("run") and snapshot.run.status:
        status = spb.RunStatus.Name(snapshot.run.status).removeprefix("RUN_STATUS_").lower()
    if status not in FINISHED_OK:
        raise OpenAIError(400, f"Previous response with id '{previous_id}' is {status}; it can be continued once "
                          "it has finished.", param="previous_response_id")
    return json.loads(snapshot.conversation_json or "[]")


def snapshot_of(identity: str, response: dict[str, Any], history: Sequence[dict[str, Any]],
                input_items: Sequence[dict[str, Any]], previous_id: str | None) -> spb.StoredResponse:
    """The stored form of a response: its object, and the conversation it ends."""
    output = list(response.get("output", []))
    return spb.StoredResponse(
        key=spb.ResponseKey(identity=identity, response_id=response["id"]), previous_response_id=previous_id or "",
        response_json=json.dumps(response), conversation_json=json.dumps([*history, *input_items, *output]),
        input_items=[spb.InputItem(id=item["id"], item_json=json.dumps(item)) for item in input_items],
        created_at=response.get("created_at") or time.time())
