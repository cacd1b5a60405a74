"""`tool_choice: "required"` and a named function, enforced: the generation is constrained (the
engine's structured output, a JSON schema) so the model can only produce a call, and its output
is read as tool calls, never as text. The schemas are vLLM's own server's
(`vllm.tool_parsers.utils.get_json_schema_from_tools`):

- a named function: the function's `parameters` schema; the output is the call's arguments,
  streamed as they are generated (the first delta carries the call's id and name). The finish
  reason stays "stop", as OpenAI and vLLM report it for a named tool_choice.
- "required": a JSON array of one or more `{"name": <a tool's name>, "parameters": <its schema>}`
  (at most one without parallel_tool_calls); each call goes out once its object is complete, and
  a "stop" finish is reported as "tool_calls" (as vLLM does).

The constraint binds from the first generated token (the engine is not told of a reasoning
parser), so a forced call carries no reasoning. A response_format cannot be combined with it: vLLM
replaces the response_format by the tool schema; here the combination is refused (400).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mship.worker.v1 import worker_pb2
from services.common.errors import invalid_parameter
from services.worker.parsers import ChoiceParser, Parsed, ParsedToolCall, new_call_id, parse_call
from services.worker.sampling import Sampling


@dataclass(frozen=True)
class ForcedCall:
    """The constraint of a request whose tool_choice forces a call: `schema` for the engine;
    `name`: the named function, None for "required"."""

    schema: dict[str, Any]
    name: str | None

    def constrain(self, sampling: Sampling) -> Sampling:
        """`sampling` with the tool schema as its structured output; a response_format already
        there is refused, naming tool_choice."""
        if sampling.json_schema is not None or sampling.json_object or sampling.regex is not None or sampling.choice:
            which = "a named function" if self.name is not None else "'required'"
            raise invalid_parameter("tool_choice", f"tool_choice {which} constrains the output to a tool call and "
                                    "cannot be combined with response_format; drop one of them")
        return dataclasses.replace(sampling, json_schema=self.schema)

    def parser_factory(self) -> Callable[[], ChoiceParser]:
        name = self.name
        if name is not None:
            return lambda: NamedCallParser(name)
        return RequiredCallsParser


def forced_call(req: worker_pb2.InferRequest, tools: list[dict[str, Any]] | None) -> ForcedCall | None:
    """The constraint `req.tool_choice` asks for, from the request's rendered `tools` (OpenAI tool
    dicts, already narrowed to the named function); None when it forces nothing."""
    mode = req.tool_choice.mode
    if not tools or mode not in (worker_pb2.TOOL_CHOICE_MODE_REQUIRED, worker_pb2.TOOL_CHOICE_MODE_FUNCTION):
        return None
    if mode == worker_pb2.TOOL_CHOICE_MODE_FUNCTION:
        fn = tools[0]["function"]
        return ForcedCall(_parameters(fn, 0), fn["name"])
    return ForcedCall(required_schema(tools, parallel=req.parallel_tool_calls), None)


def required_schema(tools: list[dict[str, Any]], *, parallel: bool) -> dict[str, Any]:
    """One or more calls of the given tools, as a JSON array (vLLM's `_get_json_schema_from_tools`):
    each tool's `$defs` move to the top, where every alternative's `$ref`s find them."""
    defs: dict[str, Any] = {}
    alternatives = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        params = copy.copy(_parameters(fn, i))  # the tool dict itself goes to the chat template unchanged
        tool_defs = params.pop("$defs", {})
        if not isinstance(tool_defs, dict):
            raise invalid_parameter(f"tools[{i}].function.parameters", "'$defs' must be an object")
        for name, schema in tool_defs.items():
            if defs.setdefault(name, schema) != schema:
                raise invalid_parameter(f"tools[{i}].function.parameters",
                                        f"'$defs' entry {name!r} differs from another tool's")
        alternatives.append({"properties": {"name": {"type": "string", "enum": [fn["name"]]},
                                            "parameters": params},
                             "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": alternatives}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _parameters(fn: dict[str, Any], i: int) -> dict[str, Any]:
    params = fn.get("parameters")
    if not isinstance(params, dict):
        raise invalid_parameter(f"tools[{i}].function.parameters", "parameters must be a JSON Schema object")
    return params or {"type": "object", "properties": {}}  # no parameters: still a JSON object


class NamedCallParser:
    """The output of a named tool_choice: the arguments of one call of `name`, streamed."""

    in_reasoning = False
    calls_finish = False  # "stop", as OpenAI and vLLM report a named tool_choice

    def __init__(self, name: str) -> None:
        self._name = name
        self.tool_calls = 0

    def feed(self, delta: str) -> Parsed:
        out = Parsed()
        if self.tool_calls:
            if delta:
                out.tool_calls.append(ParsedToolCall(0, "", "", delta))
            return out
        delta = delta.lstrip()  # whitespace the grammar allows before the JSON
        if delta:
            self._announce(out, delta)
        return out

    def finish(self) -> Parsed:
        out = Parsed()
        if not self.tool_calls:  # nothing generated (cut short): the call is still announced
            self._announce(out, "")
        return out

    def _announce(self, out: Parsed, arguments: str) -> None:
        out.tool_calls.append(ParsedToolCall(0, new_call_id(), self._name, arguments))
        self.tool_calls = 1


class RequiredCallsParser:
    """The output of tool_choice "required": a JSON array of `{"name", "parameters"}` objects, each
    going out as a call once it is complete (its text is scanned once: brackets outside strings)."""

    in_reasoning = False
    calls_finish = True

    def __init__(self) -> None:
        self.tool_calls = 0
        self._depth = 0
        self._in_string = self._escaped = False
        self._partial = ""  # the text of the call object not yet complete

    def feed(self, delta: str) -> Parsed:
        out = Parsed()
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        start = 0 if depth >= 2 else -1  # where the open call object begins in `delta`
        for i, ch in enumerate(delta):
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
                if depth == 2:
                    start = i
            elif ch in "}]":
                depth -= 1
                if depth == 1 and start >= 0:
                    self._call(out, self._partial + delta[start:i + 1])
                    self._partial, start = "", -1
        if start >= 0:
            self._partial += delta[start:]
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        return out

    def finish(self) -> Parsed:
        self._partial = ""  # a call cut short (max_tokens): not a call; the finish reason says why
        return Parsed()

    def _call(self, out: Parsed, body: str) -> None:
        call = parse_call(body, self.tool_calls)
        if call is not None:
            out.tool_calls.append(call)
            self.tool_calls += 1
