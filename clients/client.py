"""The Python gRPC client for internal callers: the low-latency path.

It watches the coordinator's routing table and calls worker replicas directly (no HTTP, no
gateway hop). Closing a stream (or cancelling the task reading it) cancels the call, and the
worker aborts the engine request.

    async with MshipClient("127.0.0.1:50051") as client:
        reply = await client.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=32)
        async for delta in client.stream_chat("chat", messages):
            print(delta.text, end="")

Replica choice is prefix affinity by default (calls that share a system prompt or a conversation's
first message go to the replica whose prefix cache holds it, while it is not much busier than the
others); `picker=LeastOutstanding()` turns it off. `cache_salt` keeps one caller's prefix cache
apart from another's, as the gateway does per identity.

`async with` waits up to `ready_timeout_s` for the first routing table, retrying a coordinator it
cannot reach; a refusal no retry changes (a wrong or missing token, an address that is not the
coordinator's) is an MshipError at once. However the wait ends (the caller's own cancel or
deadline included), a client that did not enter leaves no routing watch behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from mship.worker.v1 import worker_pb2 as pb
from services.common.auth import platform_token
from services.common.errors import ErrorDetails
from services.common.infer import UpstreamError, call_unary, left_of, open_infer, within
from services.common.picker import PrefixAffinity, ReplicaPicker
from services.common.routes import RouteTable, RoutingWatcher
from services.common.vocabulary import ENV_RAY_AUTH_TOKEN

SAMPLING_FIELDS = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}
# What a coordinator answers a routing watch with that no retry changes: a token refused, or an
# address that serves another service (e.g. the state port: UNIMPLEMENTED).
REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED}


class MshipError(Exception):
    def __init__(self, details: ErrorDetails) -> None:
        super().__init__(f"{details.code.name} {details.reason}: {details.message}")
        self.details = details


@dataclass
class ChatResult:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    finish_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)


def _messages(messages: list[dict[str, Any]]) -> list[pb.ChatMessage]:
    out = []
    for m in messages:
        msg = pb.ChatMessage(role=m["role"], content=m.get("content") or "", name=m.get("name", ""),
                             tool_call_id=m.get("tool_call_id", ""))
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
            msg.tool_calls.add(id=call.get("id", ""), name=fn["name"], arguments=args)
        out.append(msg)
    return out


async def routed(watcher: RoutingWatcher) -> None:
    """Wait for the watch's first routing table; MshipError as soon as the coordinator refuses the
    watch in a way no retry changes (the watch itself goes on retrying anything else)."""
    received = watcher.table.received
    while not received.is_set():
        waits = [asyncio.ensure_future(event.wait()) for event in (received, watcher.broke)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        watcher.broke.clear()
        err = watcher.last_error
        if not received.is_set() and err is not None and err.code() in REFUSED:
            raise MshipError(_refused(watcher, err))


def _refused(watcher: RoutingWatcher, err: grpc.aio.AioRpcError) -> ErrorDetails:
    details = ErrorDetails.from_rpc_error(err)
    if err.code() == grpc.StatusCode.UNIMPLEMENTED:
        why = (f"{watcher.coordinator} does not serve the coordinator's API: pass the coordinator's "
               "address (its --coordinator-port, default 50051), not the state or HTTP port")
    else:
        given = "a wrong token" if watcher.table.token or platform_token() else "no token"
        why = (f"the coordinator at {watcher.coordinator} refused {given}: pass token= (or set "
               f"{ENV_RAY_AUTH_TOKEN}) to the cluster token")
    return dataclasses.replace(details, message=f"{why} ({details.message})" if details.message else why)


class MshipClient:
    def __init__(self, coordinator: str, *, token: str | None = None, ready_timeout_s: float = 30.0,
                 picker: ReplicaPicker | None = None) -> None:
        """`token`: the cluster token when the platform has auth on (default: MSHIP_RAY_AUTH_TOKEN).
        `ready_timeout_s`: how long `async with` waits for the first routing table."""
        self.table = RouteTable(picker or PrefixAffinity(), token=token)
        self._watcher = RoutingWatcher(coordinator, self.table, f"client-{uuid.uuid4().hex[:8]}")
        self._ready_timeout_s = ready_timeout_s

    async def __aenter__(self) -> MshipClient:
        self._watcher.start()
        try:
            async with asyncio.timeout(self._ready_timeout_s):  # (3.11's wait_for can lose a cancel)
                await routed(self._watcher)
        except BaseException as e:  # that deadline, a refusal, or the caller's cancel or deadline
            await self._watcher.stop()  # no watch left reconnecting for a client never entered
            if not isinstance(e, TimeoutError):
                raise
            err = self._watcher.last_error
            raise MshipError(ErrorDetails.from_rpc_error(err) if err is not None else ErrorDetails(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no routing table within {self._ready_timeout_s}s")) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._watcher.stop()

    def models(self) -> list[str]:
        return sorted(self.table.routes)

    def _request(self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 cache_salt: str, sampling: dict[str, Any]) -> pb.InferRequest:
        unknown = set(sampling) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
        return pb.InferRequest(
            request_id=uuid.uuid4().hex, model=model, chat=pb.ChatInput(messages=_messages(messages)),
            sampling=pb.SamplingParams(**sampling), parse_reasoning=True, cache_salt=cache_salt,
            tools=[pb.Tool(name=t["function"]["name"], description=t["function"].get("description", ""),
                           parameters_json=json.dumps(t["function"].get("parameters", {}))) for t in tools or []])

    async def stream_chat(self, model: str, messages: list[dict[str, Any]], *,
                          tools: list[dict[str, Any]] | None = None, timeout_s: float | None = None,
                          cache_salt: str = "", **sampling: Any) -> AsyncIterator[pb.InferEvent]:
        """Yield the worker's events (deltas, then one final). Leaving the loop cancels the call."""
        if model not in self.table.routes:
            raise MshipError(ErrorDetails(grpc.StatusCode.NOT_FOUND, f"model {model!r} is not served",
                                          reason="MODEL_NOT_FOUND"))
        try:
            stream = await open_infer(self.table, model, self._request(model, messages, tools, cache_salt, sampling),
                                      timeout_s)
        except UpstreamError as e:
            raise MshipError(e.details) from e
        try:
            async for event in stream:
                yield event
        except UpstreamError as e:
            raise MshipError(e.details) from e
        finally:
            stream.close()

    async def chat(self, model: str, messages: list[dict[str, Any]], **kw: Any) -> ChatResult:
        out = ChatResult()
        async for event in self.stream_chat(model, messages, **kw):
            if event.HasField("delta"):
                out.text += event.delta.text
                out.reasoning += event.delta.reasoning
                out.tool_calls += [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                   for c in event.delta.tool_calls]
            else:
                finish = event.final.choices[0].finish_reason if event.final.choices else 0
                out.finish_reason = pb.FinishReason.Name(finish).removeprefix("FINISH_REASON_").lower()
                u = event.final.usage
                out.usage = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                             "cached_tokens": u.cached_tokens}
        return out

    async def embed(self, model: str, inputs: list[str], *, timeout_s: float | None = None) -> list[list[float]]:
        """One vector per input. `timeout_s`: the call's deadline, as for `stream_chat` (None: none)."""
        if model not in self.table.routes:
            raise MshipError(ErrorDetails(grpc.StatusCode.NOT_FOUND, f"model {model!r} is not served",
                                          reason="MODEL_NOT_FOUND"))
        request = pb.EmbedRequest(request_id=uuid.uuid4().hex, model=model, inputs=inputs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            reply = await within(timeout_s, call_unary(
                self.table, model, lambda endpoint: endpoint.stub.Embed(request, timeout=left_of(deadline))))
        except UpstreamError as e:
            raise MshipError(e.details) from e
        return [list(e.values) for e in reply.embeddings]
