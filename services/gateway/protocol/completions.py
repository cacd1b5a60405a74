"""`/v1/completions` (legacy text completions) requests: the wire model and its `pb.InferRequest`.
The `text_completion` objects (whole or streamed) are built in `completions_responses`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol.common import (
    UINT32_MAX,
    Bool,
    Int,
    SamplingFields,
    Str,
    build_request,
    invalid,
    parse_body,
    sampling_params,
    tagged,
)

TokenId = Annotated[Int, Field(ge=0, le=UINT32_MAX)]
MAX_LOGPROBS = 5  # OpenAI's limit for the legacy API


def _prompt_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    first = value[0] if value else ""
    if isinstance(first, list):
        return "token_lists"
    return "tokens" if isinstance(first, int) and not isinstance(first, bool) else "texts"


Prompt = tagged(_prompt_kind, {
    "text": Str,
    "texts": Annotated[list[Str], Field(min_length=1)],
    "tokens": Annotated[list[TokenId], Field(min_length=1)],
    "token_lists": Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)],
}, "a string, an array of strings, an array of token ids or an array of token id arrays")


class CompletionRequest(SamplingFields):
    # Required like OpenAI's, but null is refused: an empty document is no prompt for our engines.
    prompt: Prompt | None
    best_of: Int | None = Field(None, ge=1)
    echo: Bool | None = None
    logprobs: Int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: Str | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.prompt is None:
            raise invalid("prompt", "Invalid 'prompt': a prompt is required.", None)
        if isinstance(self.prompt, list) and len(self.prompt) > 1 and not isinstance(self.prompt[0], int):
            raise invalid("prompt", "Invalid 'prompt': only one prompt per request is supported; send one request "
                          "per prompt.", self.prompt)
        if self.suffix:
            raise invalid("suffix", "'suffix' (insertion) is not supported by this server.", self.suffix)
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise invalid("best_of", "Invalid 'best_of': must equal 'n' (or be unset); server-side best-of "
                          "ranking is not supported.", self.best_of)
        if self.echo and self.prompt_text is None:
            raise invalid("echo", "'echo' is only supported with a text prompt.", True)
        if self.echo and self.logprobs is not None:
            raise invalid("echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported by this "
                          "server.", True)
        return self

    @property
    def prompt_text(self) -> str | None:
        """The text prompt, or None for token ids."""
        p = self.prompt
        return p if isinstance(p, str) else p[0] if p and isinstance(p[0], str) else None

    @property
    def prompt_token_ids(self) -> list[int]:
        p = self.prompt
        if not isinstance(p, list) or not p or isinstance(p[0], str):
            return []
        return list(p[0]) if isinstance(p[0], list) else list(p)


def parse_completion_request(body: bytes | str | dict[str, Any]) -> CompletionRequest:
    """The request, or OpenAIError 400 (bad JSON, unknown field, wrong type, bad value)."""
    return parse_body(CompletionRequest, body)


def to_infer_request(req: CompletionRequest, *, request_id: str, cache_salt: str | None) -> pb.InferRequest:
    """The worker request for a validated completions request."""
    return build_request(lambda: pb.InferRequest(
        request_id=request_id, model=req.model,
        prompt=pb.PromptInput(text=req.prompt_text or "", token_ids=req.prompt_token_ids),
        sampling=sampling_params(req, logprobs=req.logprobs is not None, top_logprobs=req.logprobs),
        cache_salt=cache_salt or ""))
