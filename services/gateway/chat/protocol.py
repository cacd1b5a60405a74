"""`/v1/chat/completions` requests: the wire models as OpenAI (plus vLLM's sampling extras) accepts
them, and their `pb.InferRequest`. The response objects are built in `protocol_output`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.choices import (
    NAME_PATTERN,
    TOOL_MODES,
    JSONObjectFormat,
    content_part,
    response_format,
)
from services.gateway.protocol_common.sampling import SamplingFields, build_request, sampling_params
from services.gateway.protocol_common.validation import (
    INT32_MAX,
    Bool,
    Int,
    Str,
    WireModel,
    bad_value,
    by_field,
    by_type,
    invalid,
    missing,
    parse_body,
    tagged,
)

# ---- wire models: content parts and messages ---------------------------------------------------

ROLES = ("system", "developer", "user", "assistant", "tool")
_UNSUPPORTED_PARTS = {"input_audio": "Audio input", "file": "File input"}


# Bounds OpenAI sets too; each refused as a 400 naming the parameter (the body limit bounds the sum).
MAX_MESSAGES, MAX_TOOLS = 2048, 128
MAX_IMAGE_URL_CHARS = 20 * 2**20  # a data: URL of a 15 MB image, base64


class ImageURL(WireModel):
    url: Annotated[Str, Field(max_length=MAX_IMAGE_URL_CHARS)]
    detail: Literal["auto", "low", "high", "original"] | None = None


class TextPart(WireModel):
    type: Literal["text"]
    text: Str
    prompt_cache_breakpoint: dict[Str, Any] | None = None  # accepted and ignored


class ImagePart(WireModel):
    type: Literal["image_url"]
    image_url: ImageURL
    prompt_cache_breakpoint: dict[Str, Any] | None = None


class RefusalPart(WireModel):
    type: Literal["refusal"]
    refusal: Str


def _content(*allowed: str) -> Any:
    """`content`: a string, or a non-empty array of the `allowed` part types."""
    kinds = {"text": TextPart, "image_url": ImagePart, "refusal": RefusalPart}
    part = content_part(kinds, allowed, _UNSUPPORTED_PARTS)
    return tagged(by_type, {"str": Str, "list": Annotated[list[part], Field(min_length=1)]},
                  "a string or an array of content parts")


TextContent = _content("text")


class SystemMessage(WireModel):
    role: Literal["system"]
    content: TextContent
    name: Str | None = None


class DeveloperMessage(WireModel):
    role: Literal["developer"]
    content: TextContent
    name: Str | None = None


class UserMessage(WireModel):
    role: Literal["user"]
    content: _content("text", "image_url")
    name: Str | None = None


class FunctionCall(WireModel):
    name: Str
    arguments: Str


class ToolCallParam(WireModel):
    id: Str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(WireModel):
    role: Literal["assistant"]
    content: _content("text", "refusal") | None = None
    refusal: Str | None = None
    name: Str | None = None
    tool_calls: list[ToolCallParam] | None = None
    # vLLM: earlier reasoning, for templates that render it (either name, as vLLM accepts)
    reasoning: Str | None = None
    reasoning_content: Str | None = None
    audio: Any = None  # refused when set
    function_call: Any = None  # deprecated; refused when set

    @model_validator(mode="after")
    def _refuse(self) -> AssistantMessage:
        if self.audio is not None:
            raise invalid("audio", "Audio in assistant messages is not supported by this server.", self.audio)
        if self.function_call is not None:
            raise invalid("function_call", "'function_call' is deprecated and not supported; use 'tool_calls'.",
                          self.function_call)
        return self


class ToolMessage(WireModel):
    role: Literal["tool"]
    content: TextContent
    tool_call_id: Str


def _refuse_role(value: dict[str, Any]) -> Any:
    if "role" not in value:
        raise missing("role")
    if value["role"] == "function":
        raise invalid("role", "The 'function' role is deprecated and not supported; use 'tool' messages that "
                      "answer the assistant's 'tool_calls'.", "function")
    raise bad_value("role", value["role"], ROLES)


Message = tagged(by_field("role", ROLES), {
    "system": SystemMessage, "developer": DeveloperMessage, "user": UserMessage, "assistant": AssistantMessage,
    "tool": ToolMessage, "other": Annotated[Any, PlainValidator(_refuse_role)]}, "an object")

# ---- wire models: tools, response format -------------------------------------------------------


class FunctionDefinition(WireModel):
    name: Annotated[Str, Field(pattern=NAME_PATTERN)]
    description: Str | None = None
    parameters: dict[Str, Any] | None = None
    strict: Bool | None = None  # accepted; arguments are not schema-constrained


class FunctionTool(WireModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(WireModel):
    name: Str


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedFunction


def _refuse_tool_choice(value: dict[str, Any]) -> Any:
    kind = value.get("type")
    if kind in ("allowed_tools", "custom"):
        raise invalid("type", f"tool_choice of type '{kind}' is not supported by this server.", kind)
    raise missing("type") if kind is None else bad_value("type", kind, ("function",))


ToolChoice = tagged(by_type, {
    "str": Literal["none", "auto", "required"],
    "dict": tagged(by_field("type", ("function",)), {
        "function": NamedToolChoice, "other": Annotated[Any, PlainValidator(_refuse_tool_choice)]}, "an object"),
}, "a string or an object")


class JSONSchemaFormat(WireModel):
    name: Annotated[Str, Field(pattern=NAME_PATTERN)]
    description: Str | None = None
    schema_: dict[Str, Any] | None = Field(None, alias="schema")
    strict: Bool | None = None


class JSONSchemaResponseFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = response_format(JSONSchemaResponseFormat)


class Prediction(WireModel):
    type: Literal["content"]
    content: TextContent


# ---- wire models: the request ------------------------------------------------------------------

# Fields OpenAI accepts that ask for something this server cannot do: refused when not null.
_REFUSED = {
    "audio": "Audio output is not supported by this server.",
    "web_search_options": "Web search is not supported by this server.",
    "moderation": "Moderation is not supported by this server.",
    "functions": "'functions' is deprecated and not supported; use 'tools'.",
    "function_call": "'function_call' is deprecated and not supported; use 'tool_choice'.",
}


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: Bool | None = None
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # accepted and ignored: they change nothing this server does
    metadata: dict[Str, Str] | None = None
    store: Bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    prediction: Prediction | None = None  # a latency hint only; the output does not depend on it
    verbosity: Literal["low", "medium", "high"] | None = None
    prompt_cache_key: Str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: dict[Str, Any] | None = None
    safety_identifier: Str | None = None
    # refused when set (see _REFUSED)
    audio: Any = None
    web_search_options: Any = None
    moderation: Any = None
    functions: Any = None
    function_call: Any = None
    # vLLM's chat extras
    chat_template_kwargs: dict[Str, Any] | None = None
    continue_final_message: Bool | None = None

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        for name, message in _REFUSED.items():
            if getattr(self, name) is not None:
                raise invalid(name, message, getattr(self, name))
        if self.modalities and any(m != "text" for m in self.modalities):
            raise invalid("modalities", "Only 'text' output is supported by this server.", self.modalities)
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs", "Invalid 'top_logprobs': 'logprobs' must be set to true when "
                          "'top_logprobs' is used.", self.top_logprobs)
        names = [t.function.name for t in self.tools or []]
        choice = self.tool_choice
        if choice not in (None, "none", "auto") and not names:
            raise invalid("tool_choice", "Invalid 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                          "specified.", choice if isinstance(choice, str) else None)
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise invalid("tool_choice", f"Invalid 'tool_choice': the function '{choice.function.name}' is not "
                          "in 'tools'.", choice.function.name)
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise invalid("continue_final_message", "'continue_final_message' needs the last message to be "
                          "an assistant message.", True)
        return self


def parse_chat_request(body: bytes | str | dict[str, Any]) -> ChatCompletionRequest:
    """The request, or OpenAIError 400 (bad JSON, unknown field, wrong type, bad value)."""
    return parse_body(ChatCompletionRequest, body)


def image_parts(req: ChatCompletionRequest) -> list[tuple[str, str]]:
    """(param, url) of every image part, in order (only user messages may hold them)."""
    return [(f"messages[{i}].content[{j}]", part.image_url.url)
            for i, m in enumerate(req.messages) if isinstance(m, UserMessage) and isinstance(m.content, list)
            for j, part in enumerate(m.content) if isinstance(part, ImagePart)]


# ---- request conversion ------------------------------------------------------------------------

def _parts(parts: list[Any]) -> pb.ContentParts:
    out = pb.ContentParts()
    for part in parts:
        if isinstance(part, ImagePart):
            out.parts.add(image_url=part.image_url.url)
        else:  # text, or an assistant's refusal: both are text the model said or reads
            out.parts.add(text=part.text if isinstance(part, TextPart) else part.refusal)
    return out


def _message(m: Any) -> pb.ChatMessage:
    out = pb.ChatMessage(role=m.role, name=getattr(m, "name", None) or "")
    content = m.content
    if isinstance(m, AssistantMessage):
        content = content if content is not None else m.refusal
        out.reasoning = m.reasoning or m.reasoning_content or ""
        out.tool_calls.extend(pb.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                              for c in m.tool_calls or [])
    if isinstance(m, ToolMessage):
        out.tool_call_id = m.tool_call_id
    if isinstance(content, str):
        out.content = content
    elif content is not None:
        out.parts.CopyFrom(_parts(content))
    return out


def _response_format(fmt: Any) -> pb.ResponseFormat | None:
    if fmt is None:
        return None
    if isinstance(fmt, JSONSchemaResponseFormat):
        spec = fmt.json_schema
        return pb.ResponseFormat(json_schema=pb.JsonSchema(
            name=spec.name, schema_json=json.dumps(spec.schema_ or {}), strict=bool(spec.strict)))
    return pb.ResponseFormat(json_object=True) if isinstance(fmt, JSONObjectFormat) else pb.ResponseFormat(text=True)


def _tool_choice(choice: Any) -> pb.ToolChoice:
    if isinstance(choice, NamedToolChoice):
        return pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name=choice.function.name)
    return pb.ToolChoice(mode=TOOL_MODES[choice])


def _template_kwargs(req: ChatCompletionRequest) -> str:
    """Like vLLM: reasoning_effort reaches the template (and turns thinking on or off) unless the
    caller's chat_template_kwargs say otherwise."""
    kwargs: dict[str, Any] = {}
    if req.reasoning_effort is not None:
        kwargs = {"reasoning_effort": req.reasoning_effort, "enable_thinking": req.reasoning_effort != "none"}
    kwargs.update(req.chat_template_kwargs or {})
    return json.dumps(kwargs) if kwargs else ""


def to_infer_request(req: ChatCompletionRequest, *, request_id: str, cache_salt: str | None) -> pb.InferRequest:
    """The worker request for a validated chat request; `cache_salt` comes from the caller's identity."""
    return build_request(lambda: pb.InferRequest(
        request_id=request_id, model=req.model,
        chat=pb.ChatInput(messages=[_message(m) for m in req.messages],
                          continue_final_message=bool(req.continue_final_message),
                          chat_template_kwargs_json=_template_kwargs(req)),
        sampling=sampling_params(req, logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs),
        tools=[pb.Tool(name=t.function.name, description=t.function.description or "",
                       parameters_json=json.dumps(t.function.parameters) if t.function.parameters is not None
                       else "") for t in req.tools or []],
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls is not False,  # OpenAI's default is true
        response_format=_response_format(req.response_format),
        cache_salt=cache_salt or "", parse_reasoning=True))
