"""`/v1/chat/completions` responses: the `chat.completion` object and the `chat.completion.chunk`
stream, built from the worker's `pb.InferEvent`s.
"""

from __future__ import annotations

from typing import Any

from mship.worker.v1 import worker_pb2 as pb
from services.gateway.chat.protocol import ChatCompletionRequest
from services.gateway.protocol_common.logprobs import chat_logprobs
from services.gateway.protocol_common.outputs import (
    FinalAssembler,
    finish_reason,
    finished_choices,
    new_id,
    stamp,
    usage_dict,
)


class _Choice:
    """One choice's output so far."""

    def __init__(self) -> None:
        self.text, self.reasoning = "", ""
        self.calls: dict[int, dict[str, str]] = {}  # call index -> id, name, arguments
        self.logprobs: list[pb.TokenLogprob] = []

    def add(self, delta: pb.Delta) -> None:
        self.text += delta.text
        self.reasoning += delta.reasoning
        self.logprobs.extend(delta.logprobs)
        for c in delta.tool_calls:
            call = self.calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = call["id"] or c.id
            call["name"] = call["name"] or c.name
            call["arguments"] += c.arguments


class ChatCompletionAssembler(FinalAssembler):
    """Builds the non-streamed `chat.completion` from the worker's events: `add` each event, then
    `result()` (raises OpenAIError if the engine failed or no final event came)."""

    def __init__(self, model: str, *, n: int = 1, logprobs: bool = False, top_logprobs: int | None = None,
                 parallel_tool_calls: bool = True, completion_id: str | None = None,
                 created: int | None = None) -> None:
        self.model, self.logprobs, self.parallel_tool_calls = model, logprobs, parallel_tool_calls
        self.top_logprobs = top_logprobs
        self.id, self.created = stamp("chatcmpl", completion_id, created)
        self.choices = {i: _Choice() for i in range(n)}

    @classmethod
    def for_request(cls, req: ChatCompletionRequest, **kw: Any) -> ChatCompletionAssembler:
        return cls(req.model, n=req.n or 1, logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
                   parallel_tool_calls=req.parallel_tool_calls is not False, **kw)

    def add_delta(self, delta: pb.Delta) -> None:
        self.choices.setdefault(delta.index, _Choice()).add(delta)

    def result(self) -> dict[str, Any]:
        choices = []
        for index, finish in finished_choices(self.final, self.choices):
            state = self.choices.get(index, _Choice())
            reason = finish_reason(finish)
            calls = [{"id": c["id"] or new_id("call"), "type": "function",
                      "function": {"name": c["name"], "arguments": c["arguments"]}}
                     for _, c in sorted(state.calls.items())]
            if not self.parallel_tool_calls:  # `parallel_tool_calls: false`: at most one call (as vLLM does)
                calls = calls[:1]
            message: dict[str, Any] = {"role": "assistant", "content": state.text or (None if calls else ""),
                                       "refusal": None, "annotations": []}
            if calls:
                message["tool_calls"] = calls
            if state.reasoning:
                message["reasoning_content"] = message["reasoning"] = state.reasoning
            choices.append({"index": index, "message": message, "finish_reason": reason,
                            "logprobs": {"content": chat_logprobs(state.logprobs, self.top_logprobs), "refusal": None}
                            if self.logprobs else None})
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": usage_dict(self.final.usage if self.final else None), "service_tier": None,
                "system_fingerprint": None}


class ChatStreamEncoder:
    """Turns each worker event into the `chat.completion.chunk` dicts OpenAI would stream: a role
    chunk opens each choice, deltas follow, a chunk with `finish_reason` closes it, and with
    `include_usage` a last chunk with no choices carries the usage (other chunks have `usage: null`).
    The edge frames each as a server-sent event. A failed choice raises OpenAIError: send its
    `body()` as an event, the way OpenAI reports errors mid-stream."""

    def __init__(self, model: str, *, include_usage: bool = False, logprobs: bool = False,
                 top_logprobs: int | None = None, parallel_tool_calls: bool = True,
                 completion_id: str | None = None, created: int | None = None) -> None:
        self.model, self.include_usage, self.logprobs = model, include_usage, logprobs
        self.top_logprobs, self.parallel_tool_calls = top_logprobs, parallel_tool_calls
        self.id, self.created = stamp("chatcmpl", completion_id, created)
        self.started: set[int] = set()
        self.call_ids: dict[tuple[int, int], str] = {}  # (choice, call index) -> id, once announced

    @classmethod
    def for_request(cls, req: ChatCompletionRequest, **kw: Any) -> ChatStreamEncoder:
        return cls(req.model, include_usage=req.include_usage, logprobs=bool(req.logprobs),
                   top_logprobs=req.top_logprobs or 0, parallel_tool_calls=req.parallel_tool_calls is not False,
                   **kw)

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        out = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": choices, "service_tier": None, "system_fingerprint": None}
        if self.include_usage:
            out["usage"] = usage
        return out

    def _choice(self, index: int, delta: dict[str, Any], *, logprobs: Any = None,
                finish: str | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def _open(self, index: int) -> list[dict[str, Any]]:
        """Role chunks for `index` and any lower choice not yet opened: the openai SDK's stream
        helper needs choices to appear in index order."""
        out = []
        for i in range(index + 1):
            if i not in self.started:
                self.started.add(i)
                out.append(self.chunk([self._choice(i, {"role": "assistant", "content": ""})]))
        return out

    def _tool_calls(self, index: int, calls: Any) -> list[dict[str, Any]]:
        out = []
        for c in calls:
            key = (index, c.index)
            if key in self.call_ids:
                out.append({"index": c.index, "function": {"arguments": c.arguments}})
            else:
                self.call_ids[key] = c.id or new_id("call")
                out.append({"index": c.index, "id": self.call_ids[key], "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}})
        return out

    def encode(self, event: pb.InferEvent) -> list[dict[str, Any]]:
        if event.HasField("delta"):
            d = event.delta
            out = self._open(d.index)
            calls = d.tool_calls
            if calls and not self.parallel_tool_calls:  # at most one call: the first (as vLLM does)
                calls = [c for c in calls if c.index == 0]
                if not (calls or d.text or d.reasoning or d.logprobs):
                    return out
            delta: dict[str, Any] = {}
            if d.reasoning:  # both names: vLLM's current `reasoning`, and the `reasoning_content` many clients read
                delta["reasoning_content"] = delta["reasoning"] = d.reasoning
            if d.text or not (d.reasoning or calls):
                delta["content"] = d.text
            if calls:
                delta["tool_calls"] = self._tool_calls(d.index, calls)
            logprobs = {"content": chat_logprobs(d.logprobs, self.top_logprobs), "refusal": None} \
                if self.logprobs else None
            return [*out, self.chunk([self._choice(d.index, delta, logprobs=logprobs)])]
        if not event.HasField("final"):
            return []
        out = []
        for c in sorted(event.final.choices, key=lambda c: c.index):
            reason = finish_reason(c.finish_reason)
            out += self._open(c.index)
            out.append(self.chunk([self._choice(c.index, {}, finish=reason)]))
        if self.include_usage:
            out.append(self.chunk([], usage_dict(event.final.usage)))
        return out
