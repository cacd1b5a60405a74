"""The one table that maps failed worker/coordinator gRPC calls (their `ErrorDetails`) to OpenAI
errors. Only `services.gateway.generation` calls it: every endpoint opens its generation there."""

from __future__ import annotations

import logging
import re

import grpc

from services.common.errors import ErrorDetails
from services.common.infer import START_REFUSED
from services.common.routes import MAX_MESSAGE_BYTES
from services.gateway.protocol_common.openai_error import (
    INTERNAL_MESSAGE,
    SERVER_ERROR,
    OpenAIError,
    model_not_found,
    overloaded,
    retry_after_header,
    unavailable,
)

log = logging.getLogger(__name__)

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
    endpoint (`messages` for chat, `prompt` for completions, `input` for responses) for CONTEXT_TOO_LONG;
    with `input`, the worker's chat field names in `param` read as the Responses API's (`_responses_param`)."""
    code, reason, message = details.code, details.reason, details.message or "request failed"
    param = details.field_violations[0][0] if details.field_violations else None
    if param is not None and input_param == "input":
        param, message = _responses_param(param, message)
    if reason == "MODEL_NOT_FOUND" or (code == grpc.StatusCode.NOT_FOUND and reason in ("", "MODEL_NOT_FOUND")):
        return model_not_found(model or details.metadata.get("model"))
    if reason == "CONTEXT_TOO_LONG":
        return OpenAIError(400, message, param=input_param, code="context_length_exceeded")
    if reason == "OVERLOADED":
        return overloaded(details.retry_after_s)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # gRPC's own: the request is past the message limit
        return OpenAIError(413, "The request is too large to send to the model's replicas (at most "
                           f"{MAX_MESSAGE_BYTES // 2**20} MiB).", param=input_param, code="request_too_large")
    if code == grpc.StatusCode.UNAVAILABLE or details.dropped:  # dropped: not the client's doing, no 499
        if reason == "NOT_READY":
            refused = details.metadata.get(START_REFUSED)
            text = (f"The model '{model or ''}' has no replica, and none can start now: {refused}" if refused
                    else f"The model '{model or ''}' is loading, please retry shortly.")
            return OpenAIError(503, text, type=SERVER_ERROR, code="model_not_ready",
                               headers=retry_after_header(details.retry_after_s))
        log.warning("no replica of %s answered: %s %s: %s", model, code.name, reason, message)
        return unavailable(details.retry_after_s)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return OpenAIError(504, "The request timed out.", type=SERVER_ERROR, code="timeout")
    if code == grpc.StatusCode.CANCELLED:
        # nginx's 499: the service says the request was cancelled (a Cancel by id, the client gone).
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
    return OpenAIError(501 if status == 501 else 500, INTERNAL_MESSAGE, type=SERVER_ERROR)


# The worker names the fields of its InferRequest, the chat ones; a Responses request names them
# otherwise. `input_param="input"` is Responses, embeddings or speech: only Responses makes Infer
# calls, and no Embed or Synthesize field (input, dimensions, voice, speed, a bare response_format)
# is named below, so theirs pass as they are.
_RESPONSES_NAMES = {"messages": "input", "prompt": "input", "max_tokens": "max_output_tokens",
                    "response_format.json_schema.schema": "text.format.schema"}
_RESPONSES_PARTS = {  # a part of the field (`messages[1].content[0]`): the Responses field it came from
    "messages": "input",  # the input items are not the messages one to one (instructions, tool outputs)
    "response_format": "text.format",
    "tools": "tools",  # the function tools only, renumbered
}
_ROOT = re.compile(r"([a-z_]+)[.\[]")


def _responses_param(param: str, message: str) -> tuple[str, str]:
    """A worker's field name as the Responses API names it, and the message, which may start with it."""
    name = _RESPONSES_NAMES.get(param)
    if name is None:
        root = _ROOT.match(param)
        name = _RESPONSES_PARTS.get(root.group(1), param) if root is not None else param
    if name != param and message.startswith(param + " "):
        message = name + message[len(param):]
    return name, message


def _reason_code(reason: str) -> str | None:
    return {"INVALID_PARAMETER": "invalid_value", "UNSUPPORTED_INPUT": "unsupported_input"}.get(reason)
