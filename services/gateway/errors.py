"""OpenAI error objects, and the one table that maps worker/coordinator gRPC errors to HTTP.

Every error the edge answers is an `OpenAIError`: an HTTP status plus the OpenAI body
`{"error": {"message", "type", "param", "code"}}`. Bad input is always 4xx, never 500.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common.errors import ErrorDetails

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"
# Marks a pydantic error whose message is final (raised by our own validators).
CUSTOM_ERROR = "mship"
# A union (callable discriminator) whose input matched no branch; the message says what was expected.
TYPE_ERROR = "mship_type"

_INTERNAL_MESSAGE = "The server had an error while processing your request. Sorry about that!"


class OpenAIError(Exception):
    """An HTTP error with an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __repr__(self) -> str:
        return f"OpenAIError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


# ---- helpers -----------------------------------------------------------------------------------

def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def invalid_json() -> OpenAIError:
    return OpenAIError(400, "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                            "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
                            "sent was not valid JSON.)", code="invalid_json")


def body_too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"The request body is too large (the limit is {limit} bytes).",
                       code="request_too_large")


def model_not_found(name: str | None) -> OpenAIError:
    # OpenAI answers 404 with type invalid_request_error and code model_not_found.
    return OpenAIError(404, f"The model '{name or ''}' does not exist or you do not have access to it.",
                       param="model", code="model_not_found")


def retry_after_header(retry_after_s: float | None) -> dict[str, str]:
    """`Retry-After` in whole seconds, rounded up, at least 1 (clients treat 0 as "hammer now")."""
    seconds = 1 if retry_after_s is None or retry_after_s != retry_after_s else max(1, math.ceil(retry_after_s))
    return {"Retry-After": str(seconds)}


def overloaded(retry_after_s: float | None = None, *, status: int = 429) -> OpenAIError:
    """The model is at capacity (429) or not serving right now (503); both carry Retry-After."""
    if status == 503:
        return OpenAIError(503, "The model is temporarily unavailable, please try again later.", type=SERVER_ERROR,
                           code="service_unavailable", headers=retry_after_header(retry_after_s))
    return OpenAIError(429, "The model is currently overloaded with other requests, please retry after a short wait.",
                       type=RATE_LIMIT, code="overloaded", headers=retry_after_header(retry_after_s))


def internal_error() -> OpenAIError:
    return OpenAIError(500, _INTERNAL_MESSAGE, type=SERVER_ERROR)


# ---- gRPC -> HTTP ------------------------------------------------------------------------------

# google.rpc's canonical HTTP mapping (google/rpc/code.proto), used where no reason says better.
_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_TYPE_4XX = {401: "authentication_error", 403: "permission_error", 409: "conflict_error"}


def from_grpc(details: ErrorDetails, model: str | None, *, input_param: str = "messages") -> OpenAIError:
    """The HTTP error for a failed worker/coordinator call. `input_param` names the prompt field of the
    endpoint (`messages` for chat, `prompt` for completions) for CONTEXT_TOO_LONG."""
    code, reason, message = details.code, details.reason, details.message or "request failed"
    param = details.field_violations[0][0] if details.field_violations else None
    if reason == "MODEL_NOT_FOUND" or (code == grpc.StatusCode.NOT_FOUND and reason in ("", "MODEL_NOT_FOUND")):
        return model_not_found(model or details.metadata.get("model"))
    if reason == "CONTEXT_TOO_LONG":
        return OpenAIError(400, message, param=input_param, code="context_length_exceeded")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED or reason == "OVERLOADED":
        return overloaded(details.retry_after_s, status=429)
    if code == grpc.StatusCode.UNAVAILABLE:
        if reason == "NOT_READY":
            return OpenAIError(503, f"The model '{model or ''}' is loading, please retry shortly.", type=SERVER_ERROR,
                               code="model_not_ready", headers=retry_after_header(details.retry_after_s))
        return overloaded(details.retry_after_s, status=503)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return OpenAIError(504, "The request timed out.", type=SERVER_ERROR, code="timeout")
    if code == grpc.StatusCode.CANCELLED:
        # nginx's 499: the client went away (or cancelled); the body is rarely read.
        return OpenAIError(499, "The request was cancelled.", code="request_cancelled")
    status = _STATUS.get(code, 500)
    if status == 400:
        return OpenAIError(400, message, param=param, code=_reason_code(reason))
    if status == 404:
        return OpenAIError(404, message, param=param, code="not_found")
    if status in _TYPE_4XX:
        return OpenAIError(status, message, type=_TYPE_4XX[status], param=param)
    # INTERNAL, UNKNOWN, DATA_LOSS, UNIMPLEMENTED...: the worker's text may hold internals; keep it in logs.
    log.warning("upstream error %s %s: %s", code.name, reason, message)
    return OpenAIError(501 if status == 501 else 500, _INTERNAL_MESSAGE, type=SERVER_ERROR)


def _reason_code(reason: str) -> str | None:
    return {"INVALID_PARAMETER": "invalid_value", "UNSUPPORTED_INPUT": "unsupported_input"}.get(reason)


# ---- request validation ------------------------------------------------------------------------

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


def from_validation(exc: ValidationError | RequestValidationError) -> OpenAIError:
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


# ---- FastAPI -----------------------------------------------------------------------------------

def error_response(err: OpenAIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers or None)


def install_handlers(app: FastAPI) -> None:
    """Answer every error as an OpenAI error body; unexpected exceptions become a bare 500."""

    async def on_openai(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(from_validation(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = OpenAIError(exc.status_code, str(exc.detail), type=INVALID_REQUEST if exc.status_code < 500
                          else SERVER_ERROR, headers=exc.headers)
        return error_response(err)

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        # Logged here with its traceback; the client only ever sees the generic message.
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(internal_error())

    app.add_exception_handler(OpenAIError, on_openai)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_crash)
