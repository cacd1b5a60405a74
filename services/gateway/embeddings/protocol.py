"""`/v1/embeddings`: the request's wire model and its `pb.EmbedRequest`, and the `list` of
`embedding` objects built from the worker's `pb.EmbedResponse`.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.openai_error import internal_error
from services.gateway.protocol_common.validation import (
    INT32_MAX,
    Int,
    Str,
    TokenId,
    WireModel,
    invalid,
    parse_body,
    tagged,
    text_or_tokens,
)

MAX_INPUTS = 2048  # OpenAI's limit of inputs per request


Input = tagged(text_or_tokens, {
    "text": Str,
    "texts": Annotated[list[Str], Field(min_length=1, max_length=MAX_INPUTS)],
    "tokens": Annotated[list[TokenId], Field(min_length=1)],
    "token_lists": Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                             Field(min_length=1, max_length=MAX_INPUTS)],
}, "a string, an array of strings, an array of token ids or an array of token id arrays")


class EmbeddingRequest(WireModel):
    model: Str
    input: Input
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Int | None = Field(None, ge=1, le=INT32_MAX)
    user: Str | None = None  # accepted and ignored

    @model_validator(mode="after")
    def _check_input(self) -> EmbeddingRequest:
        # An empty text embeds nothing (a model's special tokens only); OpenAI refuses it too.
        if self.input == "":
            raise invalid("input", "Invalid 'input': must not be an empty string.", "")
        if isinstance(self.input, list):
            for i, item in enumerate(self.input):
                if item == "":
                    raise invalid(("input", i), f"Invalid 'input[{i}]': must not be an empty string.", "")
        return self

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs, one per vector: texts, or token id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        return [value] if value and isinstance(value[0], int) else list(value)


def parse_embedding_request(body: bytes | str | dict[str, Any]) -> EmbeddingRequest:
    """The request, or OpenAIError 400 (bad JSON, unknown field, wrong type, bad value)."""
    return parse_body(EmbeddingRequest, body)


def to_embed_request(req: EmbeddingRequest, *, request_id: str) -> pb.EmbedRequest:
    """The worker request for a validated embeddings request."""
    out = pb.EmbedRequest(request_id=request_id, model=req.model, dimensions=req.dimensions)
    for item in req.inputs:
        if isinstance(item, str):
            out.inputs.append(item)
        else:
            out.prompts.append(pb.PromptInput(token_ids=item))
    return out

# ---- the embedding list ------------------------------------------------------------------------


def encode_vector(values: Any, encoding_format: str | None) -> list[float] | str:
    """A vector as JSON numbers, or (`base64`) its little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
    vector = list(values)
    # JSON has no NaN or infinity (the encoder would write null): a broken model's vector is a 500,
    # never a wrong answer. One sum tells, exactly: float32 values cannot add up to infinity here.
    if not math.isfinite(sum(vector)):
        raise internal_error()
    return vector


def embedding_list(req: EmbeddingRequest, reply: pb.EmbedResponse) -> dict[str, Any]:
    """The response object: one `embedding` per input, in input order."""
    if len(reply.embeddings) != len(req.inputs):  # a worker bug, never the caller's
        raise internal_error()
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(e.values, req.encoding_format)}
            for i, e in enumerate(reply.embeddings)]
    tokens = reply.usage.prompt_tokens
    return {"object": "list", "data": data, "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
