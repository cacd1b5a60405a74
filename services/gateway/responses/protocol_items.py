"""`/v1/responses` input items (messages with their content parts, function calls and their
outputs, reasoning) as the Open Responses spec and OpenAI clients send them, and the chat
messages they become for the worker. The requests that carry them are in `protocol`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, TypeAdapter, ValidationError, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.choices import FunctionName, content_part
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.protocol_common.sampling import unencodable
from services.gateway.protocol_common.validation import (
    Str,
    WireModel,
    bad_value,
    by_field,
    by_type,
    from_validation,
    invalid,
    missing,
    tagged,
)
from services.gateway.responses.protocol_mcp_items import (
    DENIED,
    MCP_ITEM_TYPES,
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    error_text,
)

ROLES = ("user", "system", "developer", "assistant")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning", "compaction", *MCP_ITEM_TYPES)
CallId = Annotated[Str, Field(min_length=1, max_length=64)]
Status = Literal["in_progress", "completed", "incomplete"]

# ---- wire models: content parts ----------------------------------------------------------------

_UNSUPPORTED_PARTS = {"input_file": "File input", "input_audio": "Audio input", "input_video": "Video input"}


class InputText(WireModel):
    type: Literal["input_text"]
    text: Str


class InputImage(WireModel):
    type: Literal["input_image"]
    image_url: Str | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None
    file_id: Any = None  # refused when set: there is no files API here

    @model_validator(mode="after")
    def _url(self) -> InputImage:
        if self.file_id is not None:
            raise invalid("file_id", "Image file ids are not supported by this server; send 'image_url' (an "
                          "http(s) URL or a data: URL).", self.file_id)
        if not self.image_url:
            raise invalid("image_url", "An 'input_image' part needs an 'image_url' (an http(s) URL or a data: URL).",
                          self.image_url)
        return self


class OutputText(WireModel):
    type: Literal["output_text"]
    text: Str
    annotations: list[Any] | None = None  # accepted and ignored (output items are sent back as they came)
    logprobs: list[Any] | None = None


class Refusal(WireModel):
    type: Literal["refusal"]
    refusal: Str


class SummaryText(WireModel):
    type: Literal["summary_text"]
    text: Str


class ReasoningText(WireModel):
    type: Literal["reasoning_text"]
    text: Str


def _content(*allowed: str) -> Any:
    """`content`: a string, or an array of the `allowed` part types."""
    kinds = {"input_text": InputText, "input_image": InputImage, "output_text": OutputText, "refusal": Refusal}
    part = content_part(kinds, allowed, _UNSUPPORTED_PARTS)
    return tagged(by_type, {"str": Str, "list": list[part]}, "a string or an array of content parts")


# ---- wire models: input items ------------------------------------------------------------------

class _Message(WireModel):
    type: Literal["message"] | None = None  # OpenAI's "easy" messages have no type
    id: Str | None = None
    status: Str | None = None


class UserMessage(_Message):
    role: Literal["user"]
    content: _content("input_text", "input_image")


class SystemMessage(_Message):
    role: Literal["system"]
    content: _content("input_text")


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: _content("input_text")


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: _content("output_text", "refusal", "input_text")
    phase: Literal["commentary", "final_answer"] | None = None  # accepted; chat templates have no use for it


class FunctionCallItem(WireModel):
    type: Literal["function_call"]
    call_id: CallId
    name: FunctionName
    arguments: Str
    id: Str | None = None
    status: Status | None = None


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"]
    call_id: CallId
    output: _content("input_text", "input_image")
    id: Str | None = None
    status: Status | None = None


class CompactionItem(WireModel):
    """The opaque item `/v1/responses/compact` returns; the gateway expands it before `to_messages`."""

    type: Literal["compaction"]
    id: Str | None = None
    encrypted_content: Annotated[Str, Field(max_length=10 * 2**20)]


class ReasoningItem(WireModel):
    type: Literal["reasoning"]
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    encrypted_content: Str | None = None  # accepted and ignored: this server encrypts nothing
    id: Str | None = None
    status: Status | None = None

    @property
    def text(self) -> str:
        """The reasoning as the chat template sees it: the raw content, else the summary."""
        parts = self.content or self.summary
        return "\n\n".join(p.text for p in parts)


def _refuse_role(value: dict[str, Any]) -> Any:
    raise missing("role") if value.get("role") is None else bad_value("role", value["role"], ROLES)


Message = tagged(by_field("role", ROLES), {
    "user": UserMessage, "system": SystemMessage, "developer": DeveloperMessage, "assistant": AssistantMessage,
    "other": Annotated[Any, PlainValidator(_refuse_role)]}, "an object")

_UNSUPPORTED_ITEMS = {
    "item_reference": "Item references ('item_reference' items) are not supported by this server; send the items "
                      "themselves, or use 'previous_response_id'.",
}


def _item_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind is None and "role" in value:
        return "message"
    return kind if kind in ITEM_TYPES else "other"


def _refuse_item(value: dict[str, Any]) -> Any:
    kind = value.get("type")
    if kind is None and "id" in value:
        kind = "item_reference"  # the spec lets an item reference go without its type
    if kind is None:
        raise missing("type")
    if kind in _UNSUPPORTED_ITEMS:
        raise invalid("type", _UNSUPPORTED_ITEMS[kind], kind)
    raise bad_value("type", kind, ITEM_TYPES)


Item = tagged(_item_kind, {
    "message": Message, "function_call": FunctionCallItem, "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem, "compaction": CompactionItem, "mcp_list_tools": McpListToolsItem,
    "mcp_call": McpCallItem, "mcp_approval_request": McpApprovalRequestItem,
    "mcp_approval_response": McpApprovalResponseItem,
    "other": Annotated[Any, PlainValidator(_refuse_item)]}, "an object")
Input = tagged(by_type, {"str": Str, "list": list[Item]}, "a string or an array of input items")
_ITEM: TypeAdapter[Any] = TypeAdapter(Item)


def check_call_ids(history: Sequence[dict[str, Any]], items: Sequence[Any]) -> None:
    """Every `function_call_output` of `items` (a request's `input`) answers a `function_call` of
    the conversation: of `history` (the stored items it continues) or earlier in `items`. One that
    answers no call is a 400 naming the item, before any engine work."""
    known = {item.get("call_id") for item in history if item.get("type") == "function_call"}
    for index, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            known.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id not in known:
            raise OpenAIError(400, f"No function call found for the function_call_output with call_id "
                              f"'{item.call_id}': it must answer a function_call of the previous response or "
                              "of this input.", param=f"input[{index}].call_id")


# ---- conversion to chat messages -------------------------------------------------------------

def parse_items(items: Sequence[Any]) -> list[Any]:
    """Input items, validating the ones given as dicts (a stored response's input and output)."""
    try:
        return [_ITEM.validate_python(i) if isinstance(i, dict) else i for i in items]
    except ValidationError as e:
        raise from_validation(e) from e


def image_parts(items: Sequence[Any]) -> list[tuple[str, str]]:
    """(param, url) of every `input_image` part of these `input` items, in order."""
    out = []
    for i, item in enumerate(items):
        field = "content" if isinstance(item, UserMessage) else "output" if isinstance(item, FunctionCallOutputItem) \
            else None
        content = getattr(item, field) if field else None
        if isinstance(content, list):
            out += [(f"input[{i}].{field}[{j}]", p.image_url or "") for j, p in enumerate(content)
                    if isinstance(p, InputImage)]
    return out


def _parts(parts: list[Any]) -> pb.ContentParts:
    out = pb.ContentParts()
    for part in parts:
        if isinstance(part, InputImage):
            out.parts.add(image_url=part.image_url)  # checked at the edge (images.py); the worker again
        else:
            out.parts.add(text=part.refusal if isinstance(part, Refusal) else part.text)
    return out


def _chat_message(role: str, content: Any, **fields: Any) -> pb.ChatMessage:
    out = pb.ChatMessage(role=role, **fields)
    if isinstance(content, str):
        out.content = content
    else:
        out.parts.CopyFrom(_parts(content))
    return out


def _tool_call(out: list[pb.ChatMessage], call_id: str, name: str, arguments: str) -> None:
    if not out or out[-1].role != "assistant":  # consecutive calls are one turn's parallel calls
        out.append(pb.ChatMessage(role="assistant"))
    out[-1].tool_calls.add(id=call_id, name=name, arguments=arguments)


def _to_messages(instructions: str | None, items: list[Any]) -> list[pb.ChatMessage]:
    out = [pb.ChatMessage(role="system", content=instructions)] if instructions else []
    reasoning = ""  # a reasoning item belongs to the assistant turn that follows it
    # MCP: a call the server ran is the model's call and its result; a denied approval request
    # is a call whose result says so; listings and approved requests (their mcp_call follows) are
    # not part of the chat
    denied = {i.approval_request_id for i in items if isinstance(i, McpApprovalResponseItem) and not i.approve}
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning += item.text
            continue
        if isinstance(item, CompactionItem):
            raise invalid("type", "A compaction item must be expanded before conversion.", "compaction")
        if isinstance(item, McpListToolsItem | McpApprovalResponseItem):
            continue
        if isinstance(item, McpApprovalRequestItem):
            if item.id in denied:
                _tool_call(out, item.id, item.name, item.arguments)
                out.append(pb.ChatMessage(role="tool", content=DENIED, tool_call_id=item.id))
            continue
        if isinstance(item, McpCallItem):
            _tool_call(out, item.id, item.name, item.arguments)
            out.append(pb.ChatMessage(role="tool", content=item.output if item.error is None else
                                      f"Error: {error_text(item.error)}", tool_call_id=item.id))
        elif isinstance(item, FunctionCallItem):
            _tool_call(out, item.call_id, item.name, item.arguments)
        elif isinstance(item, FunctionCallOutputItem):
            out.append(_chat_message("tool", item.output, tool_call_id=item.call_id))
        else:
            out.append(_chat_message(item.role, item.content))
        if reasoning and out[-1].role == "assistant":
            out[-1].reasoning += reasoning
            reasoning = ""
    return out


def to_messages(instructions: str | None, history_items: Sequence[Any], input_items: str | Sequence[Any] | None,
                ) -> list[pb.ChatMessage]:
    """The chat for one turn: `instructions` as the system message, then the previous responses'
    items (their inputs and outputs, as models or stored dicts), then this request's input.
    Function calls become assistant `tool_calls` (consecutive calls share one message), their
    outputs `tool` messages, and reasoning the next assistant message's `reasoning`."""
    items = [*parse_items(history_items),
             *([UserMessage(role="user", content=input_items)] if isinstance(input_items, str)
               else parse_items(input_items or []))]
    try:
        return _to_messages(instructions, items)
    except ValueError as e:  # lone surrogates from JSON escapes
        raise unencodable(e) from e
