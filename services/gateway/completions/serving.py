"""`POST /v1/completions`: the request, its worker call, the `text_completion` (or its chunks)."""

from __future__ import annotations

from services.gateway.completions.protocol import (
    CompletionAssembler,
    CompletionStreamEncoder,
    parse_completion_request,
    to_infer_request,
)
from services.gateway.serving import GenerationCall, GenerationServing


class CompletionServing(GenerationServing):
    def call(self, body: bytes) -> GenerationCall:
        return GenerationCall.of(parse_completion_request(body), to_infer_request, CompletionAssembler,
                                 CompletionStreamEncoder, input_param="prompt")
