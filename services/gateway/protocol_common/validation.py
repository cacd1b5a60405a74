"""Strict wire types and their validation errors, read the way OpenAI writes them.

Wire models are strict the way OpenAI is: unknown fields, a string for a number or a number for a
boolean are 400s naming the field (ints for floats are fine). `from_validation` turns the first
pydantic error (ours, or FastAPI's, which has the same `errors()`) into that 400.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Protocol, TypeVar, Union

from pydantic import AllowInfNan, BaseModel, ConfigDict, Discriminator, Field, Strict, Tag, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from services.gateway.protocol_common.openai_error import OpenAIError, invalid_json, invalid_request

# Marks a pydantic error whose message is final (raised by our own validators).
CUSTOM_ERROR = "mship"
# A union (callable discriminator) whose input matched no branch; the message says what was expected.
TYPE_ERROR = "mship_type"

# ---- strict scalar types -----------------------------------------------------------------------

Float = Annotated[float, Strict(), AllowInfNan(False)]  # strict float still takes ints, not "1" or true
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT32_MAX = 2**32 - 1
TokenId = Annotated[Int, Field(ge=0, le=UINT32_MAX)]  # a prompt or input given as token ids


class WireModel(BaseModel):
    """A request object: unknown keys are refused (OpenAI answers 400 for them)."""

    model_config = ConfigDict(extra="forbid")


# ---- raising validation errors -----------------------------------------------------------------

def refuse(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (raise it from a field validator)."""
    return PydanticCustomError(CUSTOM_ERROR, message)  # no context: the text is not formatted


def invalid(loc: str | tuple[str | int, ...], message: str, value: Any = None) -> ValidationError:
    """A validation error at `loc` relative to the model being validated (raise it from a model
    validator; pydantic prefixes the outer path)."""
    return _error(loc, refuse(message), value)


def missing(loc: str | tuple[str | int, ...]) -> ValidationError:
    return _error(loc, "missing", None)


def bad_value(loc: str | tuple[str | int, ...], value: Any, allowed: Iterable[str]) -> ValidationError:
    """The "Invalid value: 'x'. Supported values are: ..." error at `loc`."""
    expected = ", ".join(repr(a) for a in allowed)
    return _error(loc, "literal_error", value, {"expected": expected})


def _error(loc: str | tuple[str | int, ...], kind: Any, value: Any,
           ctx: dict[str, Any] | None = None) -> ValidationError:
    loc = (loc,) if isinstance(loc, str) else loc
    details = InitErrorDetails(type=kind, loc=loc, input=value)
    if ctx is not None:
        details["ctx"] = ctx
    return ValidationError.from_exception_data("request", [details])


# ---- unions that report one branch's errors ----------------------------------------------------

def text_or_tokens(value: Any) -> str | None:
    """The branch of an OpenAI text-or-tokens field (`prompt`, `input`): text | texts | tokens |
    token_lists; None when it is none of them."""
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    first = value[0] if value else ""
    if isinstance(first, list):
        return "token_lists"
    return "tokens" if isinstance(first, int) and not isinstance(first, bool) else "texts"


def tagged(choose: Callable[[Any], str | None], branches: dict[str, Any], expected: str) -> Any:
    """A union validated against the single branch `choose` names, so errors come from that branch
    only. Branch tags appear in error locations as `<tag>`, which `param_path` drops. When `choose`
    returns None the error reads "expected <expected>"."""
    def pick(value: Any) -> str | None:
        tag = choose(value)
        return None if tag is None else f"<{tag}>"

    members = tuple(Annotated[kind, Tag(f"<{tag}>")] for tag, kind in branches.items())
    return Annotated[Union[members], Discriminator(  # noqa: UP007 (a runtime tuple of members)
        pick, custom_error_type=TYPE_ERROR, custom_error_message=expected)]


def by_type(value: Any) -> str | None:
    """Pick a branch from the JSON type of the input: str, list or dict."""
    for kind, tag in ((str, "str"), (list, "list"), (dict, "dict")):
        if isinstance(value, kind):
            return tag
    return None


def by_field(field: str, known: Iterable[str]) -> Callable[[Any], str | None]:
    """Pick a branch from an object's `field` (e.g. "type", "role"): a `known` value picks its own
    branch, anything else (or no value) picks `other`; a non-object picks none."""
    names = frozenset(known)

    def choose(value: Any) -> str | None:
        if isinstance(value, dict):
            tag = value.get(field)
        elif isinstance(value, BaseModel):
            tag = getattr(value, field, None)
        else:
            return None
        return tag if isinstance(tag, str) and tag in names else "other"
    return choose


# ---- parsing a body ----------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


# `\\ud800`-`\\udfff` written as a JSON escape: a pair decodes to one character, a lone one stays a
# surrogate that no UTF-8 encoder (a response, a tokenizer, the state store) can write.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_json(raw: bytes | str) -> Any:
    """A JSON body decoded; OpenAIError 400 for broken JSON and for strings that are not Unicode
    (lone surrogates; the walk runs only when the raw text holds a surrogate escape at all).

    A body is UTF-8 (RFC 8259 8.1; a leading byte order mark is skipped), decoded strictly: `json.loads`
    would also take UTF-16 and UTF-32 (whose escapes the surrogate scan cannot see) and UTF-8-encoded
    surrogates."""
    try:
        value = json.loads(raw.removeprefix(codecs.BOM_UTF8).decode() if isinstance(raw, bytes) else raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise invalid_json() from e
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _SURROGATE_ESCAPE.search(data) and _holds_surrogate(value):
        raise OpenAIError(400, "The request body holds a lone UTF-16 surrogate (\\ud800-\\udfff): every string "
                               "must be valid Unicode.", code="invalid_unicode")
    return value


def _holds_surrogate(value: Any) -> bool:
    stack = [value]  # iterative: the nesting depth is the client's choice
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_body(model: type[M], body: bytes | str | dict[str, Any]) -> M:
    """Parse a raw JSON body (or an already decoded object) into `model`; OpenAIError 400 otherwise."""
    if isinstance(body, bytes | str):
        body = decode_json(body)
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation(e) from e


# ---- validation errors as OpenAI writes them ---------------------------------------------------

class ValidationErrors(Protocol):
    """pydantic's ValidationError, or FastAPI's RequestValidationError."""

    def errors(self) -> Sequence[Any]: ...


def param_path(loc: Sequence[int | str]) -> str | None:
    """`("messages", 0, "content")` -> `messages[0].content`. Drops FastAPI's leading "body" and the
    `<tag>` segments our tagged unions add."""
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (part.startswith("<") and part.endswith(">")):
            out += f".{part}" if out else part
    return out or None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a decimal"), (str, "a string"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return "an unknown type"


_EXPECTED = {"string_type": "a string", "int_type": "an integer", "int_from_float": "an integer",
             "float_type": "a decimal", "bool_type": "a boolean", "list_type": "an array", "dict_type": "an object",
             "model_type": "an object", "model_attributes_type": "an object", "int_parsing": "an integer",
             "float_parsing": "a decimal", "bool_parsing": "a boolean", "string_sub_type": "a string"}
_BOUNDS = {"greater_than_equal": ("below minimum value", ">=", "ge"),
           "greater_than": ("below minimum value", ">", "gt"),
           "less_than_equal": ("above maximum value", "<=", "le"),
           "less_than": ("above maximum value", "<", "lt")}


def _num(value: Any) -> Any:
    """2.0 -> 2, as OpenAI prints bounds."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _message(err: Mapping[str, Any], param: str | None) -> str:
    kind, ctx, value = err.get("type", ""), err.get("ctx") or {}, err.get("input")
    name = param or "body"
    if kind == CUSTOM_ERROR:
        return err.get("msg", "")
    if kind == TYPE_ERROR:
        return f"Invalid type for '{name}': expected {err.get('msg', '')}, but got {_kind(value)} instead."
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {name}"
    if kind == "missing":
        return f"Missing required parameter: '{name}'."
    if kind in _EXPECTED:
        return f"Invalid type for '{name}': expected {_EXPECTED[kind]}, but got {_kind(value)} instead."
    if kind in _BOUNDS:
        words, op, key = _BOUNDS[kind]
        return f"Invalid '{name}': {words}. Expected a value {op} {_num(ctx.get(key))}, but got {value!r} instead."
    if kind == "finite_number":
        return f"Invalid '{name}': expected a finite number, but got {value!r} instead."
    if kind == "literal_error":
        return f"Invalid value: {value!r}. Supported values are: {ctx.get('expected')}."
    if kind == "too_short" and isinstance(value, list) and not value:
        return (f"Invalid '{name}': empty array. Expected an array with minimum length {ctx.get('min_length')}, "
                "but got an empty array instead.")
    if kind == "too_long":
        return (f"Invalid '{name}': array too long. Expected an array with maximum length {ctx.get('max_length')}, "
                f"but got an array with length {ctx.get('actual_length')} instead.")
    if kind == "string_pattern_mismatch":
        return (f"Invalid '{name}': string does not match pattern. Expected a string that matches the pattern "
                f"'{ctx.get('pattern')}'.")
    if kind == "string_too_long":
        return (f"Invalid '{name}': string too long. Expected a string with maximum length "
                f"{ctx.get('max_length')}, but got a string with length {len(value or '')} instead.")
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"Invalid '{name}': {msg}"


def from_validation(exc: ValidationErrors) -> OpenAIError:
    """400 for the first validation error, with `param` the indexed path of the offending field."""
    errors = list(exc.errors())
    if not errors:
        return invalid_request("Invalid request body.")
    err = errors[0]
    if err.get("type") == "json_invalid":
        return invalid_json()
    param = param_path(err.get("loc", ()))
    if param is None and err.get("type") in _EXPECTED:
        return invalid_request("The request body must be a JSON object.")
    return invalid_request(_message(err, param), param)
