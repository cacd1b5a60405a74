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
from services.state.client import MAX_MESSAGE_BYTES, NotFound, StateClient, StateError, Unavailable

FINISHED_OK = ("completed", "incomplete", "cancelled")
# A snapshot travels in one state-service message; what the request does not know yet (the
# output, the response object's echo of it) gets OUTPUT_ALLOWANCE of room.
MAX_SNAPSHOT_BYTES = MAX_MESSAGE_BYTES
OUTPUT_ALLOWANCE = 4 * 2**20


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


def store_unavailable() -> OpenAIError:
    return OpenAIError(503, "The response store is unavailable; retry shortly.", type="server_error",
                       code="store_unavailable", headers={"Retry-After": "1"})


def too_large(param: str | None, status: int = 400) -> OpenAIError:
    """A conversation whose stored snapshot would pass the state service's message limit."""
    where = ("'previous_response_id' continues a conversation" if param == "previous_response_id"
             else "'input' makes a conversation" if param == "input" else "The conversation is")
    return OpenAIError(status, f"{where} too large to store (a stored response holds at most "
                       f"{MAX_SNAPSHOT_BYTES // 2**20} MiB). Compact it with /v1/responses/compact, start a new "
                       "conversation, or send 'store': false.", param=param, code="conversation_too_large")


def store_error(e: StateError) -> OpenAIError:
    """A state failure as the HTTP error the client sees (503 for an outage or a state service that
    did not answer in time, before engine work; a key the store refuses, e.g. an id longer than any
    it holds, names no response: 404; a snapshot over the service's message limit: 413)."""
    if e.details.code == grpc.StatusCode.INVALID_ARGUMENT:
        fields = [f for f, _ in e.details.field_violations]
        if any(f.endswith("response_id") for f in fields):
            return OpenAIError(404, "Response not found.", param="response_id", code="response_not_found")
        return OpenAIError(400, "The request names something the response store cannot hold.",
                           param=fields[0].rsplit(".", 1)[-1] if fields else None)
    if isinstance(e, Unavailable) or e.details.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return store_unavailable()
    if e.details.code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # the message limit
        return too_large(None, 413)
    return OpenAIError(500, "The response store failed.", type="server_error", code="store_error")


class History(list[dict[str, Any]]):
    """A stored conversation's items, and the size of its stored JSON (known without serializing)."""

    def __init__(self, items: list[dict[str, Any]], stored_bytes: int) -> None:
        super().__init__(items)
        self.stored_bytes = stored_bytes


def json_bytes(items: Sequence[dict[str, Any]]) -> int:
    """The size of `items` as a snapshot stores them (a loaded History's is known)."""
    return items.stored_bytes if isinstance(items, History) else len(json.dumps(items))


def check_snapshot_size(history: Sequence[dict[str, Any]], inputs: Sequence[dict[str, Any]],
                        request_bytes: int) -> None:
    """Refuse, before any engine work, a turn whose snapshot would not fit in one state-service
    message. The snapshot holds the conversation (history, inputs, output), the inputs again (the
    input-item list) and the response object (the output again, and the request's other fields,
    about `request_bytes` less its input); the output gets OUTPUT_ALLOWANCE. The param names the
    larger part: the conversation continued, or this input."""
    history_bytes, input_bytes = json_bytes(history), json_bytes(inputs)
    estimate = history_bytes + 2 * input_bytes + max(0, request_bytes - input_bytes) + OUTPUT_ALLOWANCE
    if estimate > MAX_SNAPSHOT_BYTES:
        raise too_large("previous_response_id" if history_bytes > 2 * input_bytes else "input")


async def load_history(state: StateClient, identity: str, previous_id: str | None) -> list[dict[str, Any]]:
    """The conversation `previous_id` ended: its items, ready to continue from (a History)."""
    if not previous_id:
        return History([], 2)
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
    conversation = snapshot.conversation_json or "[]"
    return History(json.loads(conversation), len(conversation))  # ASCII: json.dumps escapes the rest


def snapshot_of(identity: str, response: dict[str, Any], history: Sequence[dict[str, Any]],
                input_items: Sequence[dict[str, Any]], previous_id: str | None,
                context: Sequence[dict[str, Any]] | None = None) -> spb.StoredResponse:
    """The stored form of a response: its object, and the conversation it ends: `context` (what
    the model was shown, when truncation left items out), else the history and the input items."""
    output = list(response.get("output", []))
    shown = [*history, *input_items] if context is None else list(context)
    return spb.StoredResponse(
        key=spb.ResponseKey(identity=identity, response_id=response["id"]), previous_response_id=previous_id or "",
        response_json=json.dumps(response), conversation_json=json.dumps([*shown, *output]),
        input_items=[spb.InputItem(id=item["id"], item_json=json.dumps(item)) for item in input_items],
        created_at=response.get("created_at") or time.time())
