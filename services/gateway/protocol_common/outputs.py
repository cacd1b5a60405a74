"""What chat and completions results share: ids and time, finish reasons, usage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.gateway.protocol_common.openai_error import OpenAIError, internal_error


def new_id(prefix: str) -> str:
    """`chatcmpl-…`, `cmpl-…`, `call_…` style ids."""
    sep = "_" if prefix == "call" else "-"
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def now() -> int:
    """OpenAI's `created`: unix seconds."""
    return int(time.time())


def stamp(prefix: str, given_id: str | None, created: int | None) -> tuple[str, int]:
    """A result's id and `created`: as given (tests pin them), else a new id and now."""
    return given_id or new_id(prefix), created if created is not None else now()


FINISH_REASONS: dict[int, str] = {
    pb.FINISH_REASON_UNSPECIFIED: "stop",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
    # OpenAI has no "cancelled": the SDK's types reject anything else, and "length" would tell the
    # caller to raise max_tokens. A cancelled choice ends as it stands, like a stop.
    pb.FINISH_REASON_CANCELLED: "stop",
}


def finish_reason(reason: int, *, tools: bool = True) -> str:
    """The OpenAI finish_reason; FINISH_REASON_ERROR raises a 500 (the engine failed mid-way)."""
    if reason == pb.FINISH_REASON_ERROR:
        raise OpenAIError(500, "The model failed to generate a response. Please retry your request.",
                          type="server_error", code="engine_error")
    out = FINISH_REASONS.get(reason, "stop")
    return out if tools or out != "tool_calls" else "stop"


def all_cancelled(final: pb.Final | None) -> bool:
    """Every choice was ended by Cancel: the route may answer 499 rather than a partial result."""
    return final is not None and bool(final.choices) and all(
        c.finish_reason == pb.FINISH_REASON_CANCELLED for c in final.choices)


def usage_dict(usage: common_pb2.Usage | None) -> dict[str, Any]:
    u = usage or common_pb2.Usage()
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


def finished_choices(final: pb.Final | None, started: Iterable[int]) -> list[tuple[int, int]]:
    """(index, finish reason) of every choice in index order: those deltas `started` and those the
    Final names. No Final (the stream broke off) is a 500."""
    if final is None:
        raise internal_error()
    finishes = {c.index: c.finish_reason for c in final.choices}
    return [(i, finishes.get(i, pb.FINISH_REASON_STOP)) for i in sorted(set(started) | finishes.keys())]


class FinalAssembler:
    """What the non-streamed results share: `add` each worker event; the Final is kept, each
    delta goes to `add_delta`."""

    final: pb.Final | None = None

    def add(self, event: pb.InferEvent) -> None:
        if event.HasField("final"):
            self.final = event.final
        elif event.HasField("delta"):
            self.add_delta(event.delta)

    def add_delta(self, delta: pb.Delta) -> None:
        raise NotImplementedError

    @property
    def cancelled(self) -> bool:
        """Every choice ended by Cancel (the route may prefer 499 to a partial answer)."""
        return all_cancelled(self.final)
