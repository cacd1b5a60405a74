"""Small helpers for driving a worker over gRPC in tests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc


@dataclass
class Result:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[pb.ToolCallDelta] = field(default_factory=list)
    deltas: int = 0
    final: pb.Final | None = None
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)


def chat(content: str, *, model: str = "tiny", tools: list[dict[str, Any]] | None = None,
         system: str | None = None, **kw: Any) -> pb.InferRequest:
    messages = ([pb.ChatMessage(role="system", content=system)] if system else []) + [
        pb.ChatMessage(role="user", content=content)]
    return pb.InferRequest(model=model, chat=pb.ChatInput(messages=messages), tools=[
        pb.Tool(name=t["function"]["name"], description=t["function"]["description"],
                parameters_json=json.dumps(t["function"]["parameters"])) for t in tools or []], **kw)


def greedy(max_tokens: int = 64, **kw: Any) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


async def collect(stub: worker_pb2_grpc.WorkerStub, request: pb.InferRequest) -> Result:
    out = Result()
    async for event in stub.Infer(request):
        if event.HasField("final"):
            assert out.final is None, "exactly one final event"
            out.final = event.final
            continue
        assert out.final is None, "nothing after the final event"
        out.deltas += 1
        out.text += event.delta.text
        out.reasoning += event.delta.reasoning
        out.tool_calls.extend(event.delta.tool_calls)
        out.logprobs.extend(event.delta.logprobs)
    assert out.final is not None
    return out


async def wait_load(stub: worker_pb2_grpc.WorkerStub, ok: Callable[[pb.LoadReport], bool],
                    timeout_s: float) -> tuple[pb.LoadReport, float]:
    """Poll GetLoad until `ok`; returns the report and the seconds it took (AssertionError on timeout)."""
    t0 = time.monotonic()
    while True:
        report = await stub.GetLoad(pb.GetLoadRequest())
        waited = time.monotonic() - t0
        if ok(report):
            return report, waited
        assert waited < timeout_s, f"engine state not reached within {timeout_s}s: {report}"
        await asyncio.sleep(0.02)  # frequent enough for the 100 ms bounds, light on a busy worker


async def read_rest(call) -> list[pb.InferEvent]:
    """The remaining events of a call already read with `read()` (the two APIs cannot be mixed)."""
    events = []
    while (event := await call.read()) is not grpc.aio.EOF:
        events.append(event)
    return events
