"""`POST /v1/chat/completions`: the request, its worker call, the `chat.completion` (or its chunks)."""

from __future__ import annotations

from services.gateway.chat.protocol import image_parts, parse_chat_request, to_infer_request
from services.gateway.chat.protocol_output import ChatCompletionAssembler, ChatStreamEncoder
from services.gateway.protocol_common.images import check_image_input
from services.gateway.serving import GenerationCall, GenerationServing


class ChatServing(GenerationServing):
    def call(self, body: bytes) -> GenerationCall:
        req = parse_chat_request(body)
        route = self.table.routes.get(req.model)
        if route is not None:  # else the serving refuses the model itself (404, or 503 while it loads)
            check_image_input(req.model, route.accepts_images, image_parts(req))
        return GenerationCall.of(req, to_infer_request, ChatCompletionAssembler, ChatStreamEncoder)
