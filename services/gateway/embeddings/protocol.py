"""`/v1/embeddings`: the request's wire model and its `pb.EmbedRequest`s, and the `list` of
`embedding` objects built from the worker's `pb.EmbedResponse`s.

A batch goes to the workers in as many Embed calls as keep each call's request and reply well under
the 64 MiB gRPC message limit (2048 vectors of 8192 floats alone pass it): a reply over the limit
fails as RESOURCE_EXHAUSTED, which reads as a busy model, retried elsewhere and by the client.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
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
CALL_BYTES = 16 * 2**20  # what one Embed call carries at most (request and reply), but for one huge input
UNKNOWN_DIMENSION = 8192  # a route that does not say its dimension: assume a wide model
TOKEN_BYTES = 5  # a token id's varint on the wire, at most


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


def to_embed_request(req: EmbeddingRequest, *, request_id: str,
                     inputs: Sequence[str | list[int]] | None = None) -> pb.EmbedRequest:
    """The worker request for a validated embeddings request (or for these `inputs` of it)."""
    out = pb.EmbedRequest(request_id=request_id, model=req.model, dimensions=req.dimensions)
    for item in req.inputs if inputs is None else inputs:
        if isinstance(item, str):
            out.inputs.append(item)
        else:
            out.prompts.append(pb.PromptInput(token_ids=item))
    return out


def to_embed_requests(req: EmbeddingRequest, *, request_id: str, dimension: int = 0) -> list[pb.EmbedRequest]:
    """The worker calls for a request, in input order: the inputs in runs of at most `CALL_BYTES`
    of request and reply each. `dimension`: the model's (0: not known)."""
    width = min(req.dimensions or UNKNOWN_DIMENSION, dimension or UNKNOWN_DIMENSION)
    reply_bytes = 4 * width + 16  # float32 values, and the framing of one `Embedding`
    runs: list[list[str | list[int]]] = [[]]
    size = 0
    for item in req.inputs:
        cost = reply_bytes + (len(item.encode()) if isinstance(item, str) else TOKEN_BYTES * len(item))
        if runs[-1] and size + cost > CALL_BYTES:
            runs.append([])
            size = 0
        runs[-1].append(item)
        size += cost
    if len(runs) == 1:
        return [to_embed_request(req, request_id=request_id)]
    # distinct ids: a worker takes a call under a running one's id for that request made again
    return [to_embed_request(req, request_id=f"{request_id}-{k}", inputs=run) for k, run in enumerate(runs)]

# ---- the embedding list ------------------------------------------------------------------------


def encode_vector(values: Any, encoding_format: str | None) -> list[float] | str:
    """A vector as JSON numbers, or (`base64`) its little-endian float32 bytes, as OpenAI sends them."""
    vector = list(values)
    # A NaN or infinity is a broken model's vector: a 500 in either encoding, never a wrong answer
    # (JSON cannot even carry it; base64 would hand it to the caller's numpy unnoticed). One sum
    # tells, exactly: float32 values cannot add up to infinity in a float64 sum.
    if not math.isfinite(sum(vector)):
        raise internal_error()
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def embedding_list(req: EmbeddingRequest, replies: Sequence[pb.EmbedResponse]) -> dict[str, Any]:
    """The response object from the replies to `to_embed_requests` (in their order): one
    `embedding` per input, in input order."""
    vectors = [e.values for reply in replies for e in reply.embeddings]
    if len(vectors) != len(req.inputs):  # a worker bug, never the caller's
        raise internal_error()
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
            for i, v in enumerate(vectors)]
    tokens = sum(reply.usage.prompt_tokens for reply in replies)
    return {"object": "list", "data": data, "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
