"""Token logprobs in OpenAI's two shapes: chat's (and responses') entries, and the legacy
completions API's parallel lists."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from mship.worker.v1 import worker_pb2 as pb


def finite(logprob: float) -> float:
    """-inf (and NaN) are not JSON; vLLM's convention is -9999.0."""
    return logprob if math.isfinite(logprob) else -9999.0


def _bytes(token: str, raw: bytes) -> list[int]:
    return list(raw or token.encode())


def chat_logprobs(items: Iterable[pb.TokenLogprob], top: int | None = None) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` entries, each with at most `top` alternatives (OpenAI's `top_logprobs`:
    vLLM adds the sampled token to its top k, one more than asked when it ranks below them)."""
    return [{"token": lp.token, "logprob": finite(lp.logprob), "bytes": _bytes(lp.token, lp.bytes),
             "top_logprobs": [{"token": t.token, "logprob": finite(t.logprob), "bytes": _bytes(t.token, t.bytes)}
                              for t in (lp.top if top is None else lp.top[:top])]} for lp in items]


class LegacyLogprobs:
    """The completions API's logprobs: parallel lists with character offsets into the returned text."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset  # where the next token starts in the choice's text

    def encode(self, items: Iterable[pb.TokenLogprob]) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in items:
            out["tokens"].append(lp.token)
            out["token_logprobs"].append(finite(lp.logprob))
            # "up to logprobs+1 elements": the alternatives, plus the sampled token itself
            top = {t.token: finite(t.logprob) for t in lp.top}
            top.setdefault(lp.token, finite(lp.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(lp.token)
        return out

    @staticmethod
    def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {key: [v for p in parts for v in p[key]] for key in ("tokens", "token_logprobs", "top_logprobs",
                                                                   "text_offset")}
