"""Scripted worker events (`pb.InferEvent`) for the gateway's protocol tests."""

from __future__ import annotations

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb

STOP, LENGTH, TOOLS = pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_TOOL_CALLS


def delta(text: str = "", *, index: int = 0, reasoning: str = "", calls: list[pb.ToolCallDelta] | None = None,
          logprobs: list[pb.TokenLogprob] | None = None) -> pb.InferEvent:
    return pb.InferEvent(delta=pb.Delta(index=index, text=text, reasoning=reasoning, tool_calls=calls or [],
                                        logprobs=logprobs or [], token_count=1))


def final(*reasons: int, prompt: int = 5, completion: int = 7, cached: int = 2, reasoning: int = 0) -> pb.InferEvent:
    """The Final event; one finish reason per choice (one STOP when none is given)."""
    return pb.InferEvent(final=pb.Final(
        choices=[pb.ChoiceFinish(index=i, finish_reason=r) for i, r in enumerate(reasons or (STOP,))],
        usage=common_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                               reasoning_tokens=reasoning)))


def lp(token: str, logprob: float, *top: tuple[str, float]) -> pb.TokenLogprob:
    return pb.TokenLogprob(token=token, logprob=logprob, bytes=token.encode(),
                           top=[pb.TopLogprob(token=t, logprob=v, bytes=t.encode()) for t, v in top])


def call(index: int, arguments: str, *, id: str = "", name: str = "") -> pb.ToolCallDelta:
    return pb.ToolCallDelta(index=index, id=id, name=name, arguments=arguments)



# chat-style turns (one choice)
TEXT = [delta("Hello"), delta(", world"), final(STOP)]
THINKING = [delta(reasoning="Let me "), delta(reasoning="think."), delta("42"), final(STOP, reasoning=3)]
TOOL_CALL = [delta(calls=[pb.ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city": ')]),
             delta(calls=[pb.ToolCallDelta(index=0, arguments='"Paris"}')]),
             delta(calls=[pb.ToolCallDelta(index=1, id="call_b", name="get_time", arguments="{}")]),
             final(TOOLS)]
