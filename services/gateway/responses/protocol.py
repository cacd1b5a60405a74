"""`/v1/responses` and `/v1/responses/compact` requests: the wire models of the Open Responses
create body (as OpenAI clients send it) and their `pb.InferRequest`. Input items and the chat
messages they become are in `protocol_items`; the `response` object and its event stream are
built in `protocol_events`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pydantic import Field, PlainValidator, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.mcp.tools import McpServerSpec, parse_mcp_tools
from services.gateway.protocol_common import validation
from services.gateway.protocol_common.choices import (
    TOOL_MODES,
    FunctionName,
    JSONObjectFormat,
    response_format,
)
from services.gateway.protocol_common.sampling import build_request, check_stream_options, set_present
from services.gateway.protocol_common.validation import (
    INT32_MAX,
    Bool,
    Float,
    Int,
    Str,
    WireModel,
    invalid,
    tagged,
)
from services.gateway.responses.protocol_items import Input, UserMessage, image_parts

LOGPROBS = "message.output_text.logprobs"
MAX_METADATA, MAX_METADATA_KEY = 16, 64

# ---- wire models: tools, text format, reasoning ------------------------------------------------


class FunctionTool(WireModel):
    type: Literal["function"]
    name: FunctionName
    description: Str | None = None
    parameters: dict[Str, Any] | None = None
    strict: Bool | None = None  # accepted and echoed; arguments are not schema-constrained


class McpTool(WireModel):
    """A remote MCP server whose tools the server lists, offers the model and runs (`mcp_loop`).
    Its values are checked together with the other servers' (`mcp.tools.parse_mcp_tools`)."""

    type: Literal["mcp"]
    server_label: Str
    server_url: Str | None = None
    headers: dict[Str, Str] | None = None
    authorization: Str | None = None  # OpenAI's OAuth access token: sent as `Authorization: Bearer`
    allowed_tools: Any = None
    require_approval: Any = None
    server_description: Str | None = None

    def echo(self) -> dict[str, Any]:
        """As the response repeats it: never the headers, the token, or the URL's query values
        (where a key may sit: responses are stored; credentials in the URL itself are refused)."""
        return {"type": "mcp", "server_label": self.server_label, "server_url": _without_secrets(self.server_url),
                "allowed_tools": self.allowed_tools, "require_approval": self.require_approval,
                "server_description": self.server_description, "headers": None}


def _without_secrets(url: str | None) -> str | None:
    """`url` less its query values (their names stay: the echo still says which there were)."""
    if not url:
        return url
    parts = urlsplit(url)
    query = "&".join(f"{name}=REDACTED" for name, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def _refuse_tool(value: dict[str, Any]) -> Any:
    kind = value.get("type")
    if kind is None:
        raise validation.missing("type")
    raise invalid("type", f"Tools of type '{kind}' are not supported by this server; only 'function' and 'mcp' "
                  "tools are.", kind)


Tool = tagged(validation.by_field("type", ("function", "mcp")), {
    "function": FunctionTool, "mcp": McpTool, "other": Annotated[Any, PlainValidator(_refuse_tool)]}, "an object")


class FunctionChoice(WireModel):
    type: Literal["function"]
    name: Str


class AllowedTools(WireModel):
    type: Literal["allowed_tools"]
    tools: Annotated[list[FunctionChoice], Field(min_length=1, max_length=128)]
    mode: Literal["none", "auto", "required"] = "auto"


def _refuse_tool_choice(value: dict[str, Any]) -> Any:
    kind = value.get("type")
    if kind is None:
        raise validation.missing("type")
    raise invalid("type", f"tool_choice of type '{kind}' is not supported by this server.", kind)


ToolChoice = tagged(validation.by_type, {
    "str": Literal["none", "auto", "required"],
    "dict": tagged(validation.by_field("type", ("function", "allowed_tools")), {
        "function": FunctionChoice, "allowed_tools": AllowedTools,
        "other": Annotated[Any, PlainValidator(_refuse_tool_choice)]}, "an object"),
}, "a string or an object")


class JSONSchemaFormat(WireModel):
    type: Literal["json_schema"]
    name: FunctionName = "response"  # OpenAI requires one; the spec does not
    schema_: dict[Str, Any] = Field(alias="schema")
    description: Str | None = None
    strict: Bool | None = None


Format = response_format(JSONSchemaFormat)


class TextConfig(WireModel):
    format: Format | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted and echoed


class ReasoningConfig(WireModel):
    # the spec's efforts, and OpenAI's "minimal" (run, and echoed, as the spec's nearest: "low")
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None

    @property
    def spec_effort(self) -> str | None:
        return "low" if self.effort == "minimal" else self.effort


class StreamOptions(WireModel):
    include_obfuscation: Bool | None = None  # accepted and ignored: no obfuscation padding is added


# `reasoning.encrypted_content` is accepted and ignored: reasoning comes back in plain text (`summary`)
Includable = Literal[LOGPROBS, "reasoning.encrypted_content", "message.input_image.image_url",
                     "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                     "computer_call_output.output.image_url", "code_interpreter_call.outputs"]
Metadata = dict[Str, Annotated[Str, Field(max_length=512)]]
ShortStr = Annotated[Str, Field(max_length=64)]
_REFUSED = {
    "conversation": "Conversations are not supported by this server; use 'previous_response_id'.",
    "prompt": "Prompt templates are not supported by this server.",
}

# ---- wire models: the requests -----------------------------------------------------------------


class _Inputs(WireModel):
    model: Str
    input: Input | None = None
    instructions: Str | None = None
    previous_response_id: Str | None = None
    prompt_cache_key: ShortStr | None = None  # accepted and echoed; the prefix cache keys itself

    @property
    def input_items(self) -> list[Any]:
        """`input` as items: a string is one user message."""
        if isinstance(self.input, str):
            return [UserMessage(role="user", content=self.input)]
        return list(self.input or [])

    def image_parts(self) -> list[tuple[str, str]]:
        """(param, url) of every `input_image` part of `input` (see protocol_common/images.py)."""
        return image_parts(self.input_items) if isinstance(self.input, list) else []

    @model_validator(mode="after")
    def _check_input(self) -> _Inputs:
        if self.previous_response_id == "":  # OpenAI refuses it; echoed, it would name no response
            raise invalid("previous_response_id", "Invalid 'previous_response_id': empty string. Expected a "
                          "string with minimum length 1, but got an empty string instead.", "")
        if self.input is None and self.previous_response_id is None:
            raise validation.missing("input")
        self._check_item_ids()
        return self

    def _check_item_ids(self) -> None:
        """Input item ids, where given, are non-empty and distinct: a stored response's input items
        are listed (and paged) by id, so the store refuses anything else; refused here, before any work."""
        seen: set[str] = set()
        for index, item in enumerate(self.input_items):
            item_id = getattr(item, "id", None)
            if item_id is None:
                continue  # given one when stored
            if not item_id:
                raise invalid(("input", index, "id"), f"Invalid 'input[{index}].id': empty string. Expected a string "
                              "with minimum length 1, but got an empty string instead.", item_id)
            if item_id in seen:
                raise invalid(("input", index, "id"), f"Duplicate item found with id {item_id}. Remove the duplicate "
                              "item and try again.", item_id)
            seen.add(item_id)


class ResponseRequest(_Inputs):
    store: Bool | None = None
    background: Bool | None = None
    stream: Bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    max_output_tokens: Int | None = Field(None, ge=16, le=INT32_MAX)
    max_tool_calls: Int | None = Field(None, ge=1, le=INT32_MAX)  # bounds the MCP loop's calls
    temperature: Float | None = Field(None, ge=0, le=2)
    top_p: Float | None = Field(None, gt=0, le=1)
    presence_penalty: Float | None = Field(None, ge=-2, le=2)
    frequency_penalty: Float | None = Field(None, ge=-2, le=2)
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: Metadata | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[Includable] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    user: Str | None = None
    safety_identifier: ShortStr | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    conversation: Any = None  # refused when set (see _REFUSED)
    prompt: Any = None

    @property
    def should_store(self) -> bool:
        return self.store is not False

    @property
    def logprobs(self) -> bool:
        return LOGPROBS in (self.include or [])

    @property
    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools or [] if isinstance(t, FunctionTool)]

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.function_tools]

    @property
    def mcp_servers(self) -> list[McpServerSpec]:
        return parse_mcp_tools([(i, t.model_dump(exclude_none=True)) for i, t in enumerate(self.tools or [])
                                if isinstance(t, McpTool)])

    @property
    def allowed_tools(self) -> set[str] | None:
        """The tools the model may call (`allowed_tools`), or None for all of `tools`."""
        choice = self.tool_choice
        return {t.name for t in choice.tools} if isinstance(choice, AllowedTools) else None

    @model_validator(mode="after")
    def _check_request(self) -> ResponseRequest:
        for name, message in _REFUSED.items():
            if getattr(self, name) is not None:
                raise invalid(name, message, getattr(self, name))
        check_stream_options(self.stream_options, self.stream)
        if self.background and self.store is False:
            raise invalid("background", "Background responses must be stored: 'background' needs 'store' to be "
                          "true.", True)
        self._check_metadata()
        self._check_tool_choice()
        self.mcp_servers  # noqa: B018 -- checked here: a bad server is a 400 before any work
        return self

    def _check_metadata(self) -> None:
        if self.metadata is None:
            return
        if len(self.metadata) > MAX_METADATA:
            raise invalid("metadata", f"Invalid 'metadata': too many properties. Expected an object with at most "
                          f"{MAX_METADATA} properties, but got an object with {len(self.metadata)} properties "
                          "instead.", None)
        for key in self.metadata:
            if len(key) > MAX_METADATA_KEY:
                raise invalid("metadata", f"Invalid 'metadata': keys must be at most {MAX_METADATA_KEY} characters, "
                              f"but got a key with length {len(key)}.", key)

    def _check_tool_choice(self) -> None:
        names, choice = self.tool_names, self.tool_choice
        if choice not in (None, "none", "auto") and not self.tools:  # an MCP server's tools count
            raise invalid("tool_choice", "Invalid 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                          "specified.", choice if isinstance(choice, str) else None)
        wanted = [choice.name] if isinstance(choice, FunctionChoice) else [t.name for t in getattr(choice, "tools", [])]
        for name in wanted:
            if name not in names:
                raise invalid("tool_choice", f"Invalid 'tool_choice': the function '{name}' is not in 'tools'.", name)


class CompactRequest(_Inputs):
    """`POST /v1/responses/compact`."""


def parse_response_request(body: bytes | str | dict[str, Any]) -> ResponseRequest:
    """The request, or OpenAIError 400 (bad JSON, unknown field, wrong type, bad value)."""
    return validation.parse_body(ResponseRequest, body)


def parse_compact_request(body: bytes | str | dict[str, Any]) -> CompactRequest:
    return validation.parse_body(CompactRequest, body)


# ---- request conversion ------------------------------------------------------------------------

def _tool_choice(choice: Any) -> pb.ToolChoice:
    if isinstance(choice, FunctionChoice):
        return pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name=choice.name)
    if isinstance(choice, AllowedTools):
        # every tool stays in the prompt (cacheable); calls outside the set are dropped from the output
        if choice.mode == "required" and len(choice.tools) == 1:
            return pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name=choice.tools[0].name)
        return pb.ToolChoice(mode=TOOL_MODES[choice.mode])
    return pb.ToolChoice(mode=TOOL_MODES[choice])


def _response_format(text: TextConfig | None) -> pb.ResponseFormat | None:
    fmt = text.format if text else None
    if isinstance(fmt, JSONSchemaFormat):
        return pb.ResponseFormat(json_schema=pb.JsonSchema(
            name=fmt.name, schema_json=json.dumps(fmt.schema_), strict=bool(fmt.strict)))
    if isinstance(fmt, JSONObjectFormat):
        return pb.ResponseFormat(json_object=True)
    return None if fmt is None else pb.ResponseFormat(text=True)


def _sampling(req: ResponseRequest) -> pb.SamplingParams:
    return set_present(pb.SamplingParams(logprobs=req.logprobs), {
        "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "top_logprobs": req.top_logprobs if req.logprobs else None})


def _template_kwargs(req: ResponseRequest) -> str:
    """Like chat's `reasoning_effort`: the effort reaches the template and turns thinking on or off."""
    effort = req.reasoning.spec_effort if req.reasoning else None
    return "" if effort is None else json.dumps({"reasoning_effort": effort, "enable_thinking": effort != "none"})


def to_infer_request(req: ResponseRequest, messages: Sequence[pb.ChatMessage], *, request_id: str,
                     cache_salt: str | None) -> pb.InferRequest:
    """The worker request for a validated request and its chat (see `to_messages`)."""
    return build_request(lambda: pb.InferRequest(
        request_id=request_id, model=req.model,
        chat=pb.ChatInput(messages=messages, chat_template_kwargs_json=_template_kwargs(req)),
        sampling=_sampling(req),
        tools=[pb.Tool(name=t.name, description=t.description or "",
                       parameters_json=json.dumps(t.parameters) if t.parameters is not None else "")
               for t in req.function_tools],  # the MCP servers' tools join once listed (mcp_loop)
        tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=_response_format(req.text),
        cache_salt=cache_salt or "", parse_reasoning=True))
