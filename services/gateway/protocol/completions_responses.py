"""`/v1/completions` responses: the `text_completion` object, whole or streamed, built from the
worker's `pb.InferEvent`s.
"""

from __future__ import annotations

from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.errors import internal_error
from services.gateway.protocol.common import LegacyLogprobs, all_cancelled, finish_reason, new_id, now, usage_dict
from services.gateway.protocol.completions import CompletionRequest


class _Choice:
    def __init__(self, echo: str) -> None:
        self.text, self.logprobs = echo, LegacyLogprobs(offset=len(echo))
        self.logprob_parts: list[dict[str, Any]] = []


class CompletionAssembler:
    """Builds the non-streamed `text_completion`: `add` each event, then `result()` (raises
    OpenAIError if the engine failed or no final event came)."""

    def __init__(self, model: str, *, n: int = 1, logprobs: bool = False, echo: str = "",
                 completion_id: str | None = None, created: int | None = None) -> None:
        self.model, self.want_logprobs, self.echo = model, logprobs, echo
        self.id, self.created = completion_id or new_id("cmpl"), created if created is not None else now()
        self.choices = {i: _Choice(echo) for i in range(n)}
        self.final: pb.Final | None = None

    @classmethod
    def for_request(cls, req: CompletionRequest, **kw: Any) -> CompletionAssembler:
        return cls(req.model, n=req.n or 1, logprobs=req.logprobs is not None,
                   echo=(req.prompt_text or "") if req.echo else "", **kw)

    def add(self, event: pb.InferEvent) -> None:
        if event.HasField("final"):
            self.final = event.final
        elif event.HasField("delta"):
            d = event.delta
            choice = self.choices.setdefault(d.index, _Choice(self.echo))
            choice.text += d.text
            if self.want_logprobs:
                choice.logprob_parts.append(choice.logprobs.encode(d.logprobs))

    @property
    def cancelled(self) -> bool:
        """Every choice ended by Cancel (the route may prefer 499 to a partial answer)."""
        return all_cancelled(self.final)

    def result(self) -> dict[str, Any]:
        if self.final is None:
            raise internal_error()
        finishes = {c.index: c.finish_reason for c in self.final.choices}
        choices = []
        for index in sorted(self.choices.keys() | finishes.keys()):
            state = self.choices.get(index, _Choice(self.echo))
            choices.append({"index": index, "text": state.text,
                            "finish_reason": finish_reason(finishes.get(index, pb.FINISH_REASON_STOP), tools=False),
                            "logprobs": LegacyLogprobs.merge(state.logprob_parts) if self.want_logprobs else None})
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": usage_dict(self.final.usage), "system_fingerprint": None}


class CompletionStreamEncoder:
    """Turns each worker event into streamed `text_completion` dicts: text deltas (the echoed prompt
    first, when asked), a closing chunk per choice with `finish_reason`, and with `include_usage` a
    last chunk with no choices and the usage (other chunks have `usage: null`)."""

    def __init__(self, model: str, *, include_usage: bool = False, logprobs: bool = False, echo: str = "",
                 completion_id: str | None = None, created: int | None = None) -> None:
        self.model, self.include_usage, self.want_logprobs, self.echo = model, include_usage, logprobs, echo
        self.id, self.created = completion_id or new_id("cmpl"), created if created is not None else now()
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
