"""`/v1/completions` (legacy text completions): the request's wire model and its `pb.InferRequest`,
and the `text_completion` objects (whole or streamed) built from the worker's `pb.InferEvent`s.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.logprobs import LegacyLogprobs
from services.gateway.protocol_common.outputs import (
    FinalAssembler,
    finish_reason,
    finished_choices,
    stamp,
    usage_dict,
)
from services.gateway.protocol_common.sampling import SamplingFields, build_request, sampling_params
from services.gateway.protocol_common.validation import (
    Bool,
    Int,
    Str,
    TokenId,
    invalid,
    parse_body,
    tagged,
    text_or_tokens,
)

MAX_LOGPROBS = 5  # OpenAI's limit for the legacy API


Prompt = tagged(text_or_tokens, {
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

# ---- the text_completion objects ----------------------------------------------------------------


class _Choice:
    def __init__(self, echo: str) -> None:
        self.text, self.logprobs = echo, LegacyLogprobs(offset=len(echo))
        self.logprob_parts: list[dict[str, Any]] = []


class CompletionAssembler(FinalAssembler):
    """Builds the non-streamed `text_completion`: `add` each event, then `result()` (raises
    OpenAIError if the engine failed or no final event came)."""

    def __init__(self, model: str, *, n: int = 1, logprobs: bool = False, echo: str = "",
                 completion_id: str | None = None, created: int | None = None) -> None:
        self.model, self.want_logprobs, self.echo = model, logprobs, echo
        self.id, self.created = stamp("cmpl", completion_id, created)
        self.choices = {i: _Choice(echo) for i in range(n)}

    @classmethod
    def for_request(cls, req: CompletionRequest, **kw: Any) -> CompletionAssembler:
        return cls(req.model, n=req.n or 1, logprobs=req.logprobs is not None,
                   echo=(req.prompt_text or "") if req.echo else "", **kw)

    def add_delta(self, delta: pb.Delta) -> None:
        choice = self.choices.setdefault(delta.index, _Choice(self.echo))
        choice.text += delta.text
        if self.want_logprobs:
            choice.logprob_parts.append(choice.logprobs.encode(delta.logprobs))

    def result(self) -> dict[str, Any]:
        choices = []
        for index, finish in finished_choices(self.final, self.choices):
            state = self.choices.get(index, _Choice(self.echo))
            choices.append({"index": index, "text": state.text, "finish_reason": finish_reason(finish, tools=False),
                            "logprobs": LegacyLogprobs.merge(state.logprob_parts) if self.want_logprobs else None})
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": usage_dict(self.final.usage if self.final else None),
                "system_fingerprint": None}


class CompletionStreamEncoder:
    """Turns each worker event into streamed `text_completion` dicts: text deltas (the echoed prompt
    first, when asked), a closing chunk per choice with `finish_reason`, and with `include_usage` a
    last chunk with no choices and the usage (other chunks have `usage: null`)."""

    def __init__(self, model: str, *, include_usage: bool = False, logprobs: bool = False, echo: str = "",
                 completion_id: str | None = None, created: int | None = None) -> None:
        self.model, self.include_usage, self.want_logprobs, self.echo = model, include_usage, logprobs, echo
        self.id, self.created = stamp("cmpl", completion_id, created)
        self.offsets: dict[int, LegacyLogprobs] = {}  # per choice; present once the choice has begun

    @classmethod
    def for_request(cls, req: CompletionRequest, **kw: Any) -> CompletionStreamEncoder:
        return cls(req.model, include_usage=req.include_usage, logprobs=req.logprobs is not None,
                   echo=(req.prompt_text or "") if req.echo else "", **kw)

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": choices, "system_fingerprint": None}
        if self.include_usage:
            out["usage"] = usage
        return out

    def _begin(self, index: int) -> str:
        """The echoed prompt the first time a choice speaks, else ""."""
        if index in self.offsets:
            return ""
        self.offsets[index] = LegacyLogprobs(offset=len(self.echo))
        return self.echo

    def encode(self, event: pb.InferEvent) -> list[dict[str, Any]]:
        if event.HasField("delta"):
            d = event.delta
            text = self._begin(d.index) + d.text
            logprobs = self.offsets[d.index].encode(d.logprobs) if self.want_logprobs else None
            return [self.chunk([{"index": d.index, "text": text, "logprobs": logprobs, "finish_reason": None}])]
        if not event.HasField("final"):
            return []
        out = []
        for c in sorted(event.final.choices, key=lambda c: c.index):
            reason = finish_reason(c.finish_reason, tools=False)
            out.append(self.chunk([{"index": c.index, "text": self._begin(c.index), "logprobs": None,
                                    "finish_reason": reason}]))
        if self.include_usage:
            out.append(self.chunk([], usage_dict(event.final.usage)))
        return out
