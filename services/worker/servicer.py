"""The `mship.worker.v1.Worker` gRPC servicer: validates, renders, streams, cancels.

Everything that can be refused is refused before the engine sees the request. Cancelling the call
(client hang-up, deadline) cancels this handler task, which aborts the engine request; `Cancel`
aborts by id where no live stream exists. A call naming a delivery stream (services/worker/delivery.py)
sends its deltas there and only its Final on the call. Refusals are raised as `ServiceError`; the server's
`ErrorInterceptor` turns them into the call's status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.delivery import DELIVERED
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.common.limits import replica_limits
from services.common.tracing import record_usage
from services.worker import metrics
from services.worker.audio_servicer import AudioCalls
from services.worker.delivery import Deliveries
from services.worker.engine import ChoiceDelta, Engine, Prompt, RenderRequest
from services.worker.host import ModelHost
from services.worker.inflight import InflightRequests
from services.worker.parsers import ChoiceParser, StreamParser, opens_reasoning
from services.worker.request_gate import RequestGate
from services.worker.sampling import Sampling, sampling_from_request
from services.worker.tool_choice import ForcedCall, forced_call

log = logging.getLogger(__name__)
FINISH = {"stop": worker_pb2.FINISH_REASON_STOP, "length": worker_pb2.FINISH_REASON_LENGTH,
          "abort": worker_pb2.FINISH_REASON_CANCELLED}
ENGINE_DIED_RETRY_S = 2.0
DEATH_GRACE_S = 0.5  # how long a failed request waits to see whether the engine died under it
SUPERSEDE_WAIT_S = 2.0  # how long a request made again waits for its older call to end


class WorkerServicer(AudioCalls, worker_pb2_grpc.WorkerServicer):
    def __init__(self, host: ModelHost, gate: RequestGate | None = None) -> None:
        self.host = host
        self.gate = gate or RequestGate()
        self.inflight = InflightRequests()  # running or queued (Cancel by id, the autoscaler's load)
        self.deliveries = Deliveries()
        self._embeds: dict[str, asyncio.Future] = {}  # Embed batches at the engine, by request id (Cancel)

    # ---- Load --------------------------------------------------------------------------------
    async def Load(self, request: worker_pb2.LoadRequest, context) -> AsyncIterator[worker_pb2.LoadProgress]:
        spec = request.spec
        if not spec.name or not spec.model:
            raise invalid_parameter("spec", "spec.name and spec.model are required")
        if self.host.spec is None:
            self.host.begin_load(spec)
            self.gate.apply(replica_limits(spec))
        elif (self.host.spec.name, self.host.spec.model) != (spec.name, spec.model):
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION, Reason.INVALID_PARAMETER,
                f"this worker serves {self.host.spec.name!r} ({self.host.spec.model}); start another worker")
        async for event in self.host.progress():
            yield event

    # ---- Infer -------------------------------------------------------------------------------
    async def Infer(self, request: worker_pb2.InferRequest, context) -> AsyncIterator[worker_pb2.InferEvent]:
        engine = self._engine_for(request.model)
        sampling = sampling_from_request(request)
        render, parse_tools = self._render_request(request)
        forced = forced_call(request, render.tools)  # tool_choice "required" or a named function
        if forced is not None:
            sampling = forced.constrain(sampling)
        try:
            with self.host.watch.working():  # llama.cpp renders and tokenizes on its server
                prompt = await engine.render(render)
        except ServiceError:
            raise
        except Exception as e:
            raise await self._engine_failure(engine, request.request_id, e) from e
        self._check_context(engine, prompt, sampling)
        request_id = request.request_id or uuid.uuid4().hex
        admitted = await self._admit(request_id)
        outcome = "cancelled"  # unless it ends otherwise: the caller went away (or Cancel)
        delivery, tag, delivered = self.deliveries.attach(request), request.delivery.tag, 0
        try:
            async with self.gate.admitted(request_id):  # backpressure: an engine place, or a queue slot, or refused
                async for event in self._stream(engine, prompt, sampling, request, request_id, parse_tools, forced):
                    if event.HasField("final"):
                        outcome = "finished"
                        event.final.delivered = delivered
                        _count_tokens(request.model, event.final.usage)
                        record_usage(request.model, event.final.usage)  # the Infer span's, when traced
                    elif delivery is not None:
                        delivered += delivery.send(tag, event)
                        continue
                    yield event
        except ServiceError as e:
            outcome = "refused" if e.reason == Reason.OVERLOADED else "failed"
            if delivered:  # on the delivery stream, which the error overtakes: the caller waits for them
                e.metadata[DELIVERED] = str(delivered)
            raise
        finally:  # released however the call ends (finished, refused, cancelled)
            self.inflight.release(request_id, admitted)
            if delivery is not None:
                delivery.detach()
            metrics.REQUESTS.labels(request.model, outcome).inc()
            log.debug("infer %s on %s ended (%d prompt tokens)", request_id, request.model, len(prompt.token_ids))

    async def _stream(self, engine: Engine, prompt: Prompt, sampling: Sampling, request: worker_pb2.InferRequest,
                      request_id: str, parse_tools: bool,
                      forced: ForcedCall | None = None) -> AsyncIterator[worker_pb2.InferEvent]:
        new_parser = self._parser_factory(prompt, request, parse_tools, forced)  # decided once per request
        parsers: dict[int, ChoiceParser] = {}
        finishes: dict[int, worker_pb2.ChoiceFinish] = {}
        usage = common_pb2.Usage(prompt_tokens=len(prompt.token_ids))
        watch, steps = self.host.watch, engine.generate(prompt, sampling, request_id, request.priority)
        try:  # (the watch: a hung engine is noticed by the host's health check)
            while (step := await watch.next_step(steps)) is not None:
                usage.prompt_tokens, usage.cached_tokens = step.prompt_tokens, step.cached_tokens
                for choice in step.choices:
                    parser = parsers.get(choice.index)
                    if parser is None:
                        parser = parsers[choice.index] = new_parser()
                    event = self._delta(choice, parser, usage)
                    if event is not None:
                        yield event
                    if choice.finish_reason is not None:
                        finishes[choice.index] = self._finish(choice, parser, request_id)
                if step.finished:
                    break
        except ServiceError:
            raise
        except Exception as e:
            raise await self._engine_failure(engine, request_id, e) from e
        yield worker_pb2.InferEvent(final=worker_pb2.Final(
            choices=[finishes[i] for i in sorted(finishes)], usage=usage))

    def _parser_factory(self, prompt: Prompt, request: worker_pb2.InferRequest, parse_tools: bool,
                        forced: ForcedCall | None) -> Callable[[], ChoiceParser]:
        """How each choice's output is read: as the forced tool call(s), or split into reasoning,
        content and tool calls (starting as reasoning where the prompt left `<think>` open)."""
        if forced is not None:
            return forced.parser_factory()
        reasoning = request.parse_reasoning and self._reasoning_enabled()
        opened = reasoning and opens_reasoning(prompt.tail)
        return lambda: StreamParser(reasoning=reasoning, tools=parse_tools, opened=opened)

    def _delta(self, choice: ChoiceDelta, parser: ChoiceParser,
               usage: common_pb2.Usage) -> worker_pb2.InferEvent | None:
        in_reasoning = parser.in_reasoning
        parsed = parser.feed(choice.text)
        if choice.finish_reason is not None:
            rest = parser.finish()
            parsed.text += rest.text
            parsed.reasoning += rest.reasoning
            parsed.tool_calls += rest.tool_calls
        usage.completion_tokens += choice.num_tokens
        if in_reasoning or parser.in_reasoning:
            usage.reasoning_tokens += choice.num_tokens
        if not parsed and not choice.logprobs:
            return None
        # Set in place, the lists only when there are any: ~0.5 µs a token against ~1.7 by keywords.
        event = worker_pb2.InferEvent()
        delta = event.delta
        delta.index, delta.text, delta.reasoning, delta.token_count = \
            choice.index, parsed.text, parsed.reasoning, choice.num_tokens
        if parsed.tool_calls:
            delta.tool_calls.extend(worker_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name,
                                                             arguments=c.arguments) for c in parsed.tool_calls)
        if choice.logprobs:
            delta.logprobs.extend(worker_pb2.TokenLogprob(
                token=lp.token, logprob=lp.logprob, bytes=lp.token.encode(),
                top=[worker_pb2.TopLogprob(token=t.token, logprob=t.logprob, bytes=t.token.encode())
                     for t in lp.top]) for lp in choice.logprobs)
        return event

    def _finish(self, choice: ChoiceDelta, parser: ChoiceParser, request_id: str) -> worker_pb2.ChoiceFinish:
        reason = FINISH.get(choice.finish_reason or "", worker_pb2.FINISH_REASON_ERROR)
        if reason == worker_pb2.FINISH_REASON_STOP and parser.tool_calls and parser.calls_finish:
            reason = worker_pb2.FINISH_REASON_TOOL_CALLS
        return worker_pb2.ChoiceFinish(index=choice.index, finish_reason=reason,
                                       stop_sequence=choice.stop_sequence or "")

    async def Deliver(self, request: worker_pb2.DeliverRequest,
                      context) -> AsyncIterator[worker_pb2.DeliveryBatch]:
        async for batch in self.deliveries.serve():
            yield batch

    # ---- validation --------------------------------------------------------------------------
    def _engine_for(self, model: str) -> Engine:
        if not model or model != self.host.model_name:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, Reason.MODEL_NOT_FOUND,
                               f"model {model!r} is not served here", metadata={"model": model})
        if self.host.engine_lost:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.ENGINE_DIED,
                               f"the engine of this replica of {model!r} stopped; it is being replaced",
                               retry_after_s=ENGINE_DIED_RETRY_S)
        if not self.host.ready or self.host.engine is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.NOT_READY,
                               f"model {model!r} is still loading", retry_after_s=1.0)
        return self.host.engine

    async def _engine_failure(self, engine: Engine, request_id: str, e: Exception) -> ServiceError:
        """A request the engine failed: retryable (UNAVAILABLE: another replica, or this one once Serve
        has replaced it) when the engine itself died, else an engine error. A killed engine process
        breaks its connections a moment before it can be seen dead: give it that moment."""
        deadline = time.monotonic() + DEATH_GRACE_S
        while not engine.errored and time.monotonic() < deadline:  # noqa: ASYNC110 (no event says it)
            await asyncio.sleep(0.02)
        if engine.errored:
            log.warning("the engine died under %s: %s", request_id, e)
            return ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.ENGINE_DIED,
                                "this replica's engine stopped; the request can be retried",
                                retry_after_s=ENGINE_DIED_RETRY_S)
        log.exception("engine failed on %s", request_id)
        return ServiceError(grpc.StatusCode.INTERNAL, Reason.ENGINE_ERROR, f"engine error: {e}")

    def _check_context(self, engine: Engine, prompt: Prompt, sampling: Sampling) -> None:
        n, limit = len(prompt.token_ids), engine.max_model_len
        if n == 0:  # engines refuse it mid-call (vLLM raises); a request to fix, not a server error
            raise invalid_parameter("prompt", "the prompt is empty: it renders to no tokens for this model")
        wanted = n + (sampling.max_tokens or 1)
        if n >= limit or wanted > limit:
            asked = f"{n} in the prompt" + (f" + {sampling.max_tokens} max_tokens" if sampling.max_tokens else "")
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT, Reason.CONTEXT_TOO_LONG,
                f"this model's maximum context length is {limit} tokens, but {wanted} were requested "
                f"({asked})", field_violations=[("messages", "input is longer than the context")],
                metadata={"prompt_tokens": str(n), "max_model_len": str(limit)})

    def _reasoning_enabled(self) -> bool:
        return (self.host.spec.reasoning_parser if self.host.spec else "") != "none"

    def _render_request(self, req: worker_pb2.InferRequest) -> tuple[RenderRequest, bool]:
        """The engine-neutral render input, and whether to parse tool calls out of the output."""
        kind = req.WhichOneof("input")
        if kind is None:
            raise invalid_parameter("messages", "either chat messages or a prompt is required")
        if kind == "prompt":
            return RenderRequest(prompt=req.prompt.text, prompt_token_ids=list(req.prompt.token_ids) or None,
                                 cache_salt=req.cache_salt or None), False
        if not req.chat.messages:
            raise invalid_parameter("messages", "messages must not be empty")
        tools = _tools(req)
        try:
            kwargs = json.loads(req.chat.chat_template_kwargs_json) if req.chat.chat_template_kwargs_json else {}
        except json.JSONDecodeError as e:
            raise invalid_parameter("chat_template_kwargs", f"not valid JSON: {e}") from e
        tool_parser = self.host.spec.tool_parser if self.host.spec else ""
        return RenderRequest(
            messages=[_message(m, i, images=self.host.engine is not None and self.host.engine.accepts_images)
                      for i, m in enumerate(req.chat.messages)], tools=tools or None,
            chat_template_kwargs=kwargs if isinstance(kwargs, dict) else {},
            continue_final_message=req.chat.continue_final_message,
            cache_salt=req.cache_salt or None), bool(tools) and tool_parser != "none"

    # ---- Embed / Cancel / GetLoad ------------------------------------------------------------
    async def Embed(self, request: worker_pb2.EmbedRequest, context) -> worker_pb2.EmbedResponse:
        engine = self._engine_for(request.model)
        if not engine.supports_embeddings:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                               f"model {request.model!r} does not serve embeddings")
        inputs: list[str | list[int]] = ([list(p.token_ids) if p.token_ids else p.text for p in request.prompts]
                                         or list(request.inputs))
        if not inputs:
            raise invalid_parameter("input", "input must not be empty")
        dims = request.dimensions if request.HasField("dimensions") else None
        if dims is not None and dims < 1:
            raise invalid_parameter("dimensions", "dimensions must be >= 1")
        request_id = request.request_id or uuid.uuid4().hex
        admitted = await self._admit(request_id)  # one made again supersedes its older call, as for Infer
        try:
            async with self.gate.admitted(request_id):  # backpressure, as for Infer
                # The engines run a batch under ids of their own: Cancel by this id cancels it here
                batch = self._embeds[request_id] = asyncio.ensure_future(engine.embed(inputs, dims))
                try:
                    with self.host.watch.working():
                        vectors, tokens = await batch
                except asyncio.CancelledError:
                    if asyncio.current_task().cancelling():  # type: ignore[union-attr]  # the caller left
                        raise
                    raise ServiceError(grpc.StatusCode.CANCELLED, Reason.ERROR_REASON_UNSPECIFIED,
                                       f"request {request_id!r} was cancelled") from None
        except ServiceError:
            raise
        except Exception as e:
            raise await self._engine_failure(engine, request_id, e) from e
        finally:
            self._embeds.pop(request_id, None)
            self.inflight.release(request_id, admitted)
        return worker_pb2.EmbedResponse(
            embeddings=[worker_pb2.Embedding(values=v) for v in vectors],
            usage=common_pb2.Usage(prompt_tokens=tokens))

    async def Cancel(self, request: worker_pb2.CancelRequest, context) -> worker_pb2.CancelResponse:
        return worker_pb2.CancelResponse(cancelled=await self._cancel(request.request_ids))

    async def _cancel(self, request_ids: Iterable[str]) -> list[str]:
        """End the requests of these ids running or queued here (each call ends with its Final)."""
        known = [rid for rid in dict.fromkeys(request_ids) if rid in self.inflight]
        running = [rid for rid in known if not self.gate.cancel_waiting(rid)]  # queued ones end right here
        for rid in running:
            if (batch := self._embeds.get(rid)) is not None:
                batch.cancel()
        if running and self.host.engine is not None:
            await self.host.engine.abort(running)
        return known

    async def _admit(self, request_id: str) -> asyncio.Event:
        """Count a request in (release it with what this returns). One of the same id still running
        here is that request made again (services/worker/inflight.py): the older call is cancelled,
        and this one runs once it ended."""
        if request_id in self.inflight:
            await self._cancel([request_id])
            if not await self.inflight.ended(request_id, SUPERSEDE_WAIT_S):  # retryable: elsewhere, or here soon
                raise ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.ERROR_REASON_UNSPECIFIED,
                                   f"request {request_id!r} is still ending here; it was made again too soon",
                                   retry_after_s=1.0)
        return self.inflight.add(request_id)

    async def GetLoad(self, request: worker_pb2.GetLoadRequest, context) -> worker_pb2.LoadReport:
        engine = self.host.engine
        report = worker_pb2.LoadReport(model=self.host.model_name, ready=await self.host.check(),
                                       inflight_calls=len(self.inflight))
        if engine is not None:
            s = engine.stats()
            report.running_requests, report.waiting_requests = s.running_requests, s.waiting_requests
            report.kv_cache_usage = s.kv_cache_usage
            report.generated_tokens_total, report.prompt_tokens_total = (
                s.generated_tokens_total, s.prompt_tokens_total)
            report.max_model_len, report.embedding_dimension = engine.max_model_len, engine.embedding_dimension
            report.audio_seconds_total = s.audio_seconds_total
        return report


def _count_tokens(model: str, usage: common_pb2.Usage) -> None:
    metrics.PROMPT_TOKENS.labels(model).inc(usage.prompt_tokens)
    metrics.CACHED_TOKENS.labels(model).inc(usage.cached_tokens)
    metrics.GENERATION_TOKENS.labels(model).inc(usage.completion_tokens)


def _tools(req: worker_pb2.InferRequest) -> list[dict[str, Any]]:
    mode = req.tool_choice.mode
    if mode == worker_pb2.TOOL_CHOICE_MODE_NONE or not req.tools:
        return []
    tools = []
    for i, tool in enumerate(req.tools):
        if not tool.name:
            raise invalid_parameter(f"tools[{i}].function.name", "tool name is required")
        try:
            params = json.loads(tool.parameters_json) if tool.parameters_json else {"type": "object"}
        except json.JSONDecodeError as e:
            raise invalid_parameter(f"tools[{i}].function.parameters", f"not valid JSON: {e}") from e
        tools.append({"type": "function", "function": {
            "name": tool.name, "description": tool.description, "parameters": params}})
    if mode == worker_pb2.TOOL_CHOICE_MODE_FUNCTION:
        named = [t for t in tools if t["function"]["name"] == req.tool_choice.function_name]
        if not named:
            raise invalid_parameter("tool_choice", f"tool {req.tool_choice.function_name!r} is not in tools")
        return named
    return tools


def _message(m: worker_pb2.ChatMessage, i: int, images: bool = False) -> dict[str, Any]:
    """One chat message as the engine renders it; `images`: a vision engine (image parts are kept as
    OpenAI `image_url` parts, which it checks and decodes), else an image part is refused."""
    role = "system" if m.role == "developer" else m.role
    if role not in ("system", "user", "assistant", "tool"):
        raise invalid_parameter(f"messages[{i}].role", f"unknown role {m.role!r}")
    out: dict[str, Any] = {"role": role}
    if m.WhichOneof("body") == "parts":
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(m.parts.parts):
            if part.WhichOneof("part") == "image_url":
                if not images:
                    raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, Reason.UNSUPPORTED_INPUT,
                                       "this model does not accept image input",
                                       field_violations=[(f"messages[{i}].content[{j}]", "image input")])
                parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
            else:
                parts.append({"type": "text", "text": part.text})
        has_image = any(p["type"] == "image_url" for p in parts)
        out["content"] = parts if has_image else "".join(p["text"] for p in parts)
    else:
        out["content"] = m.content
    if m.name:
        out["name"] = m.name
    if role == "tool":
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    return out
