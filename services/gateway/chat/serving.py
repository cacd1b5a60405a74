"""`POST /v1/chat/completions`: the request, its worker call, the `chat.completion` (or its chunks)."""

from __future__ import annotations

from services.gateway.chat.protocol import parse_chat_request, to_infer_request
from services.gateway.chat.protocol_output import ChatCompletionAssembler, ChatStreamEncoder
from services.gateway.serving import GenerationCall, GenerationServing


class ChatServing(GenerationServing):
    def call(self, body: bytes) -> GenerationCall:
        return GenerationCall.of(parse_chat_request(body), to_infer_request, ChatCompletionAssembler,
                                 ChatStreamEncoder)
