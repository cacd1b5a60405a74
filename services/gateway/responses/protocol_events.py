"""`/v1/responses` results: the `response` object (the Open Responses `ResponseResource`, which the
`openai` SDK's `Response` also reads) and its semantic event stream, built from the worker's
`pb.InferEvent`s.

Output items open in the order the model produces them: a `reasoning` item for reasoning, a
`message` with one `output_text` part for text, one `function_call` item per tool call; a change of
kind closes the open item. Reasoning is exposed as the item's `summary` (one `summary_text` part,
streamed as `response.reasoning_summary_*` events): those are the only reasoning events both the
spec and the `openai` SDK define (the spec calls raw-content deltas `response.reasoning.delta`,
OpenAI `response.reasoning_text.delta`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.choices import JSONObjectFormat
from services.gateway.protocol_common.logprobs import chat_logprobs
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.protocol_common.outputs import now
from services.gateway.responses.protocol import AllowedTools, FunctionChoice, JSONSchemaFormat
from services.gateway.responses.protocol import ResponseRequest as Request

# The terminal event of each final status. The spec has no `response.cancelled`: a cancelled
# response ends with `response.incomplete`, its status `cancelled`.
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete",
            "cancelled": "response.incomplete", "failed": "response.failed"}
ENGINE_ERROR = "The model failed to generate a response. Please retry your request."
# OpenAI's `ResponseError.code` is a closed set; these are the codes of it that can happen here
_ERROR_CODES = {400: "invalid_prompt", 429: "rate_limit_exceeded"}


def new_item_id(prefix: str) -> str:
    """`resp_…`, `msg_…`, `rs_…`, `fc_…`, `call_…`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_object(usage: common_pb2.Usage | None) -> dict[str, Any] | None:
    """The Responses `usage` (with OpenAI's `cache_write_tokens`, which its SDK requires)."""
    if usage is None:
        return None
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def _format(req: Request) -> dict[str, Any]:
    fmt = req.text.format if req.text else None
    if isinstance(fmt, JSONSchemaFormat):
        # the spec's `JsonSchemaResponseFormat` holds `schema: null` (the schema itself is not echoed)
        return {"type": "json_schema", "name": fmt.name, "description": fmt.description, "schema": None,
                "strict": bool(fmt.strict)}
    return {"type": "json_object"} if isinstance(fmt, JSONObjectFormat) else {"type": "text"}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, FunctionChoice):
        return {"type": "function", "name": choice.name}
    if isinstance(choice, AllowedTools):
        if choice.mode == "none":
            return "none"  # the same thing; OpenAI's `allowed_tools` knows only auto and required
        return {"type": "allowed_tools", "mode": choice.mode,
                "tools": [{"type": "function", "name": t.name} for t in choice.tools]}
    return choice or "auto"


def echo_fields(req: Request, *, defaults: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The request fields a `response` object repeats, each the spec requires present. Unset
    sampling values read `defaults` (the model's own, when the caller knows them), else OpenAI's."""
    values = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
              **(defaults or {})}
    for name in values:
        if getattr(req, name) is not None:
            values[name] = getattr(req, name)
    reasoning = req.reasoning
    return {
        **values,
        "instructions": req.instructions, "previous_response_id": req.previous_response_id,
        "tools": [t.echo() if t.type == "mcp" else {"type": "function", "name": t.name, "description": t.description,
                                                    "parameters": t.parameters, "strict": t.strict}
                  for t in req.tools or []],
        "tool_choice": _tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls is not False,
        "max_output_tokens": req.max_output_tokens, "max_tool_calls": req.max_tool_calls,
        "top_logprobs": req.top_logprobs or 0, "text": {"format": _format(req), "verbosity": (
            req.text.verbosity if req.text and req.text.verbosity else "medium")},
        "reasoning": {"effort": reasoning.spec_effort if reasoning else None,
                      "summary": reasoning.summary if reasoning else None},
        "truncation": req.truncation or "disabled", "store": req.should_store, "background": bool(req.background),
        "service_tier": "default", "metadata": dict(req.metadata or {}), "user": req.user,
        "safety_identifier": req.safety_identifier, "prompt_cache_key": req.prompt_cache_key,
    }


class _Item:
    """One output item so far: its text (message text, reasoning, or call arguments)."""

    def __init__(self, kind: str, index: int, *, call_id: str = "", name: str = "") -> None:
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        self.kind, self.index, self.id = kind, index, new_item_id(prefix)
        self.call_id, self.name = call_id, name
        self.text, self.status = "", "in_progress"
        self.logprobs: list[dict[str, Any]] = []
        self.part_open = False  # the message's output_text part / the reasoning's summary part

    def part(self) -> dict[str, Any]:
        if self.kind == "reasoning":
            return {"type": "summary_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": list(self.logprobs)}

    def body(self) -> dict[str, Any]:
        base = {"id": self.id, "type": self.kind, "status": self.status}
        if self.kind == "message":
            return {**base, "role": "assistant", "content": [self.part()] if self.part_open else []}
        if self.kind == "reasoning":
            return {**base, "summary": [self.part()] if self.part_open else []}
        return {**base, "call_id": self.call_id, "name": self.name, "arguments": self.text}


class ResponseStreamEncoder:
    """Turns the worker's events into the response's stream events: `start()` first, `encode()`
    each worker event, and on a failure outside the worker's events (the call broke, or ended with
    no Final) `fail()`. Every event carries `sequence_number`, counting on from `sequence_number`
    (an encoder continuing a replayed stream starts past it). `response` is the object as it
    stands; after the one terminal event (`done`) it is final. The edge frames each event
    (`event:` line included) and ends the stream with `[DONE]`, as the spec asks."""

    failed_dependency = False  # failed because a dependency (an MCP server) did, not the engine

    def __init__(self, model: str, echo: Mapping[str, Any] | None = None, *, response_id: str | None = None,
                 created_at: int | None = None, sequence_number: int = 0, logprobs: bool = False,
                 allowed_tools: set[str] | None = None) -> None:
        self.model, self.logprobs, self.allowed_tools = model, logprobs, allowed_tools
        self.echo = dict(echo) if echo is not None else echo_fields(Request(model=model, input=""))
        self.id = response_id or new_item_id("resp")
        self.created_at = created_at if created_at is not None else now()
        self.sequence_number = sequence_number
        self.status = "in_progress"
        self.items: list[_Item] = []
        self.open: _Item | None = None
        self.calls: dict[int, _Item | None] = {}  # worker call index -> its item (None: dropped)
        self.error: dict[str, Any] | None = None
        self.failure: OpenAIError | None = None  # what a failed response failed of, as the edge maps it
        self.incomplete_details: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.completed_at: int | None = None

    @classmethod
    def for_request(cls, req: Request, *, defaults: Mapping[str, float] | None = None,
                    **kw: Any) -> ResponseStreamEncoder:
        return cls(req.model, echo_fields(req, defaults=defaults), logprobs=req.logprobs,
                   allowed_tools=req.allowed_tools, **kw)

    @property
    def done(self) -> bool:
        return self.status not in ("queued", "in_progress")

    @property
    def response(self) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
                "completed_at": self.completed_at, "error": self.error, "incomplete_details": self.incomplete_details,
                "model": self.model, "output": [item.body() for item in self.items], "usage": self.usage, **self.echo}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def _on(self, item: _Item, kind: str, **fields: Any) -> dict[str, Any]:
        return self._event(kind, item_id=item.id, output_index=item.index, **fields)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self, *, queued: bool = False) -> list[dict[str, Any]]:
        """`response.created`, then `response.in_progress` (or `response.queued`: call
        `in_progress()` when the work starts)."""
        self.status = "queued" if queued else "in_progress"
        return [self._event("response.created", response=self.response),
                self._event(f"response.{self.status}", response=self.response)]

    def in_progress(self) -> list[dict[str, Any]]:
        self.status = "in_progress"
        return [self._event("response.in_progress", response=self.response)]

    def encode(self, event: pb.InferEvent) -> list[dict[str, Any]]:
        if self.done:
            return []
        if event.HasField("delta"):
            d, out = event.delta, []
            if d.reasoning:
                out += self._append("reasoning", d.reasoning)
            if d.text:
                out += self._append("message", d.text, chat_logprobs(d.logprobs) if self.logprobs else [])
            for call in d.tool_calls:
                out += self._call(call)
            return out
        if event.HasField("final"):
            return self._final(event.final)
        return []

    def fail(self, err: OpenAIError | None = None) -> list[dict[str, Any]]:
        """End as `failed` (no-op once done): `err`'s message for client errors, a generic one else."""
        if self.done:
            return []
        self.failure = err
        if err is not None and err.status < 500:
            error = {"code": _ERROR_CODES.get(err.status, "invalid_prompt"), "message": err.message}
        else:
            error = {"code": "server_error", "message": ENGINE_ERROR}
        return self._finish("failed", error=error)

    def error_out(self, err: OpenAIError) -> list[dict[str, Any]]:
        """An `error` event for `err`, then the failed terminal event (a call that broke)."""
        return [self.error_event(err), *self.fail(err)]

    def cancel(self) -> list[dict[str, Any]]:
        """End as `cancelled` (no-op once done)."""
        return [] if self.done else self._finish("cancelled")

    def error_event(self, err: OpenAIError) -> dict[str, Any]:
        """An `error` event numbered in this stream (send `fail()`'s events after it)."""
        event = error_event(err, self.sequence_number)
        self.sequence_number += 1
        return event

    # ---- items -------------------------------------------------------------------------------

    def _open_item(self, kind: str, **kw: Any) -> list[dict[str, Any]]:
        out = self._close()
        item = self.open = _Item(kind, len(self.items), **kw)
        self.items.append(item)
        out.append(self._event("response.output_item.added", output_index=item.index, item=item.body()))
        if kind != "function_call":
            item.part_open = True
            if kind == "message":
                out.append(self._on(item, "response.content_part.added", content_index=0, part=item.part()))
            else:
                out.append(self._on(item, "response.reasoning_summary_part.added", summary_index=0,
                                    part=item.part()))
        return out

    def _append(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        out = [] if self.open is not None and self.open.kind == kind else self._open_item(kind)
        item = self.open
        assert item is not None
        item.text += text
        if kind == "reasoning":
            out.append(self._on(item, "response.reasoning_summary_text.delta", summary_index=0, delta=text))
        else:
            item.logprobs += logprobs or []
            out.append(self._on(item, "response.output_text.delta", content_index=0, delta=text,
                                logprobs=logprobs or []))
        return out

    def _call(self, call: pb.ToolCallDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if call.index not in self.calls:
            if self.allowed_tools is not None and call.name not in self.allowed_tools:
                self.calls[call.index] = None  # `allowed_tools` is a hard limit: the call is dropped
                return []
            out += self._open_item("function_call", call_id=call.id or new_item_id("call"), name=call.name)
            self.calls[call.index] = self.open
        item = self.calls[call.index]
        if item is None:
            return out
        item.text += call.arguments
        if item is self.open and call.arguments:  # a fragment for a closed call only completes its item
            out.append(self._on(item, "response.function_call_arguments.delta", delta=call.arguments))
        return out

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        item.status = status
        if item.kind == "message":
            out = [self._on(item, "response.output_text.done", content_index=0, text=item.text,
                            logprobs=list(item.logprobs)),
                   self._on(item, "response.content_part.done", content_index=0, part=item.part())]
        elif item.kind == "reasoning":
            out = [self._on(item, "response.reasoning_summary_text.done", summary_index=0, text=item.text),
                   self._on(item, "response.reasoning_summary_part.done", summary_index=0, part=item.part())]
        else:
            out = [self._on(item, "response.function_call_arguments.done", arguments=item.text)]
        return [*out, self._event("response.output_item.done", output_index=item.index, item=item.body())]

    # ---- the end -----------------------------------------------------------------------------

    def _final(self, final: pb.Final) -> list[dict[str, Any]]:
        self.usage = usage_object(final.usage)
        reasons = {c.index: c.finish_reason for c in final.choices}
        reason = reasons.get(0, pb.FINISH_REASON_STOP)
        if reason == pb.FINISH_REASON_ERROR:
            return self._finish("failed", error={"code": "server_error", "message": ENGINE_ERROR})
        if reason == pb.FINISH_REASON_CANCELLED:
            return self._finish("cancelled")
        if reason == pb.FINISH_REASON_LENGTH:
            return self._finish("incomplete", incomplete={"reason": "max_output_tokens"})
        return self._finish("completed")

    def _finish(self, status: str, *, error: dict[str, Any] | None = None,
                incomplete: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if status == "completed" and all(i.kind == "reasoning" for i in self.items):
            out += self._open_item("message")  # the answer was empty: say so with an empty message
        # the item being generated when the response stopped short stays `incomplete`
        out += self._close("completed" if status == "completed" else "incomplete")
        self.status, self.error, self.incomplete_details = status, error, incomplete
        self.completed_at = now() if status == "completed" else None
        out.append(self._event(TERMINAL[status], response=self.response))
        return out


class ResponseAssembler:
    """The non-streamed `response`: `add` each worker event, then `result()`. A response whose
    stream ended without a Final is `failed`; the route decides how to answer a failed one."""

    def __init__(self, model: str, echo: Mapping[str, Any] | None = None, *,
                 encoder: ResponseStreamEncoder | None = None, **kw: Any) -> None:
        self.encoder = encoder or ResponseStreamEncoder(model, echo, **kw)

    @classmethod
    def for_request(cls, req: Request, **kw: Any) -> ResponseAssembler:
        return cls(req.model, encoder=ResponseStreamEncoder.for_request(req, **kw))

    def add(self, event: pb.InferEvent) -> None:
        self.encoder.encode(event)

    @property
    def status(self) -> str:
        return self.encoder.status

    def result(self) -> dict[str, Any]:
        self.encoder.fail()  # no-op after a Final
        return self.encoder.response


def error_event(err: OpenAIError, sequence_number: int) -> dict[str, Any]:
    """The stream's `error` event: the spec's nested `error` object, and OpenAI's flat fields."""
    payload = {"type": err.type, "code": err.code, "message": err.message, "param": err.param}
    return {"type": "error", "sequence_number": sequence_number, "code": err.code, "message": err.message,
            "param": err.param, "error": payload}
