"""The gateway's OpenAI protocol layer: wire models, their worker requests, and the OpenAI
response objects built from worker events. Pure functions and classes; no I/O.

- `chat` / `chat_responses`: `/v1/chat/completions` (wire models and worker request / response objects)
- `completions` / `completions_responses`: `/v1/completions` (likewise)
- `responses` / `responses_items` / `responses_events`: `/v1/responses` and `/v1/responses/compact`
  (request wire models and worker request / input items and their chat / response object and events)
- `common`: strict wire types, sampling fields, usage, finish reasons, logprobs, ids, SSE framing
"""

from __future__ import annotations

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol import chat, completions
from services.gateway.protocol.chat import ChatCompletionRequest, parse_chat_request
from services.gateway.protocol.chat_responses import ChatCompletionAssembler, ChatStreamEncoder
from services.gateway.protocol.common import SSE_DONE, finish_reason, new_id, now, sse_event, usage_dict
from services.gateway.protocol.completions import CompletionRequest, parse_completion_request
from services.gateway.protocol.completions_responses import CompletionAssembler, CompletionStreamEncoder
from services.gateway.protocol.responses import (
    CompactRequest,
    ResponseRequest,
    parse_compact_request,
    parse_response_request,
    to_messages,
)
from services.gateway.protocol.responses import to_infer_request as responses_infer_request
from services.gateway.protocol.responses_events import (
    ResponseAssembler,
    ResponseStreamEncoder,
    echo_fields,
    error_event,
    sse_response_event,
)


def to_infer_request(req: ChatCompletionRequest | CompletionRequest, *, request_id: str,
                     cache_salt: str | None) -> pb.InferRequest:
    """The worker request for either endpoint's validated request."""
    module = chat if isinstance(req, ChatCompletionRequest) else completions
    return module.to_infer_request(req, request_id=request_id, cache_salt=cache_salt)  # type: ignore[arg-type]


__all__ = [
    "SSE_DONE",
    "ChatCompletionAssembler",
    "ChatCompletionRequest",
    "ChatStreamEncoder",
    "CompactRequest",
    "CompletionAssembler",
    "CompletionRequest",
    "CompletionStreamEncoder",
    "ResponseAssembler",
    "ResponseRequest",
    "ResponseStreamEncoder",
    "echo_fields",
    "error_event",
    "finish_reason",
    "new_id",
    "now",
    "parse_chat_request",
    "parse_compact_request",
    "parse_completion_request",
    "parse_response_request",
    "responses_infer_request",
    "sse_event",
    "sse_response_event",
    "to_infer_request",
    "to_messages",
    "usage_dict",
]
