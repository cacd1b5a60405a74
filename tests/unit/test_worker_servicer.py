"""The servicer around the engine (validation, parsing, finish reasons, Cancel, admission), on a
real grpc.aio server with an in-process engine double (tests/engine_double.py). Engine behaviour
itself is proven on real vLLM in tests/integration."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.errors import ErrorDetails
from tests.engine_double import ScriptedEngine, serve_worker
from tests.helpers import until
from tests.worker_calls import chat, collect, read_rest

TOOL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


async def test_tool_call_split_across_steps(served):
    stub = await served(ScriptedEngine([TOOL[i:i + 5] for i in range(0, len(TOOL), 5)]))
    r = await collect(stub, chat("weather?", model="m", tools=[{"type": "function", "function": {
        "name": "get_weather", "description": "", "parameters": {"type": "object"}}}]))
    assert r.text == "" and [c.name for c in r.tool_calls] == ["get_weather"]
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_TOOL_CALLS


async def test_tool_markup_is_text_without_tools(served):
    stub = await served(ScriptedEngine([TOOL]))
    r = await collect(stub, chat("weather?", model="m"))
    assert r.text == TOOL and r.final.choices[0].finish_reason == pb.FINISH_REASON_STOP


async def test_not_ready_is_unavailable_with_retry(served):
    stub = await served(ScriptedEngine(["x"]), ready=False)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat("hi", model="m"))
    d = ErrorDetails.from_rpc_error(info.value)
    assert (d.code, d.reason, d.retry_after_s) == (grpc.StatusCode.UNAVAILABLE, "NOT_READY", 1.0)


async def test_context_check_counts_max_tokens(served):
    stub = await served(ScriptedEngine(["x"], max_model_len=10))
    request = chat("one two three four five", model="m", sampling=pb.SamplingParams(max_tokens=6))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, request)
    d = ErrorDetails.from_rpc_error(info.value)
    assert d.reason == "CONTEXT_TOO_LONG" and d.metadata == {"prompt_tokens": "5", "max_model_len": "10"}
    request.sampling.max_tokens = 5
    assert (await collect(stub, request)).text == "x"


async def test_admission_limit_and_a_request_made_again(served):
    """One engine place: another request is refused OVERLOADED. The same request id again (its
    caller made it again: the connection broke before the first token, possibly unseen here)
    supersedes the running call: that one is cancelled like a Cancel by id, then the new one runs."""
    engine = ScriptedEngine(["a", "b"])
    engine.hold.clear()
    stub = await served(engine, max_ongoing=1)
    first = stub.Infer(chat("hi", model="m", request_id="r1"))
    await first.read()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat("hi", model="m", request_id="r2"))
    assert ErrorDetails.from_rpc_error(info.value).reason == "OVERLOADED"
    again = stub.Infer(chat("hi", model="m", request_id="r1"))
    assert (await read_rest(first))[-1].final.choices[0].finish_reason == pb.FINISH_REASON_CANCELLED
    events = await read_rest(again)
    assert [e.WhichOneof("event") for e in events] == ["delta", "delta", "final"]
    assert events[-1].final.choices[0].finish_reason == pb.FINISH_REASON_STOP
    assert engine.started == ["r1", "r1"]


async def test_a_request_made_again_whose_older_call_does_not_end_is_refused_retryable(served, monkeypatch):
    """The older call did not end within the wait (here: an engine whose abort does nothing): the new
    one is refused UNAVAILABLE with a retry delay (a 503, not the client's 400), the older runs on."""
    monkeypatch.setattr("services.worker.servicer.SUPERSEDE_WAIT_S", 0.05)
    engine = ScriptedEngine(["a", "b"])
    engine.hold.clear()

    async def ignored(request_ids):
        pass

    engine.abort = ignored
    stub = await served(engine)
    first = stub.Infer(chat("hi", model="m", request_id="r1"))
    await first.read()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat("hi", model="m", request_id="r1"))
    details = ErrorDetails.from_rpc_error(info.value)
    assert (details.code, details.retry_after_s) == (grpc.StatusCode.UNAVAILABLE, 1.0) and details.reason
    engine.hold.set()
    assert [e.WhichOneof("event") for e in await read_rest(first)] == ["delta", "final"]


async def test_cancel_by_id_ends_the_stream_cancelled(served):
    engine = ScriptedEngine(["a", "b", "c"])
    engine.hold.clear()
    stub = await served(engine)
    call = stub.Infer(chat("hi", model="m", request_id="r1"))
    await call.read()
    assert list((await stub.Cancel(pb.CancelRequest(request_ids=["r1", "zzz"]))).cancelled) == ["r1"]
    events = await read_rest(call)
    assert events[-1].final.choices[0].finish_reason == pb.FINISH_REASON_CANCELLED


async def test_engine_failure_is_internal_engine_error(served):
    engine = ScriptedEngine(["a", "b"])
    engine.fail = True
    stub = await served(engine)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(stub, chat("hi", model="m"))
    d = ErrorDetails.from_rpc_error(info.value)
    assert (d.code, d.reason) == (grpc.StatusCode.INTERNAL, "ENGINE_ERROR")


async def test_bad_messages(served):
    stub = await served(ScriptedEngine(["x"]))
    cases = {"messages": pb.InferRequest(model="m"),
             "messages[0].role": chat("hi", model="m"),
             "tools[0].function.parameters": chat("hi", model="m")}
    cases["messages[0].role"].chat.messages[0].role = "wizard"
    cases["tools[0].function.parameters"].tools.add(name="f", parameters_json="{nope")
    for param, request in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(stub, request)
        assert ErrorDetails.from_rpc_error(info.value).field_violations[0][0] == param


class HeldEmbedder(ScriptedEngine):
    """Embeds once `hold` is set, one zero vector per input."""

    supports_embeddings = True
    embedding_dimension = 2

    async def embed(self, inputs, dimensions):
        await self.hold.wait()
        return [[0.0, 0.0] for _ in inputs], len(inputs)


async def test_an_embed_made_again_supersedes_its_older_call():
    """As for Infer: the same request id again (its caller's connection broke) cancels the older
    call, here still queued for an engine place, and runs once that one ended."""
    engine = HeldEmbedder([])
    engine.hold.clear()
    worker = await serve_worker(engine, max_ongoing=1, max_queued=4)
    try:
        async with grpc.aio.insecure_channel(worker.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            busy = stub.Embed(pb.EmbedRequest(model="m", inputs=["x"], request_id="busy"))
            await until(lambda: worker.servicer.gate.ongoing == 1, "the engine place taken")
            older = stub.Embed(pb.EmbedRequest(model="m", inputs=["x"], request_id="e1"))
            await until(lambda: worker.servicer.gate.queued == 1, "the older call queued")
            newer = stub.Embed(pb.EmbedRequest(model="m", inputs=["y"], request_id="e1"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(older, 5)
            assert info.value.code() == grpc.StatusCode.CANCELLED
            engine.hold.set()
            assert len((await asyncio.wait_for(newer, 5)).embeddings) == 1
            assert len((await busy).embeddings) == 1
            await until(lambda: not worker.servicer.inflight and worker.servicer.gate.ongoing == 0, "all ended")
    finally:
        engine.hold.set()
        await worker.server.stop(0)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "", "parameters": {"type": "object"}}}


async def test_a_named_tool_choice_constrains_the_output_to_that_call(served):
    """tool_choice naming a function: the engine generates that function's arguments (its
    parameters as the JSON schema), which stream out as one call (id and name first), never as
    text; the finish reason stays "stop", as vLLM's server (and OpenAI) report it."""
    engine = ScriptedEngine([' {"city"', ': "Pa', 'ris"}'])
    stub = await served(engine)
    events = [e async for e in stub.Infer(chat("weather?", model="m", tools=[WEATHER, TIME], tool_choice=pb.ToolChoice(
        mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name="get_weather")))]
    calls = [c for e in events[:-1] for c in e.delta.tool_calls]
    assert all(not e.delta.text for e in events[:-1]) and len(calls) == 3  # streamed as generated
    assert (calls[0].index, calls[0].name, bool(calls[0].id)) == (0, "get_weather", True)
    assert all(c.index == 0 and not c.id and not c.name for c in calls[1:])
    assert "".join(c.arguments for c in calls) == '{"city": "Paris"}'
    assert events[-1].final.choices[0].finish_reason == pb.FINISH_REASON_STOP
    assert engine.samplings[0].json_schema == WEATHER["function"]["parameters"]
    assert [t["function"]["name"] for t in engine.renders[0].tools] == ["get_weather"]


async def test_tool_choice_required_constrains_the_output_to_calls(served):
    """tool_choice "required": the engine generates a JSON array of {name, parameters} (vLLM's
    schema), read as tool calls; "stop" becomes "tool_calls"."""
    out = '[{"name": "get_weather", "parameters": {"city": "Paris {x} [y]"}}, {"name": "get_time", "parameters": {}}]'
    engine = ScriptedEngine([out[i:i + 6] for i in range(0, len(out), 6)])
    stub = await served(engine)
    r = await collect(stub, chat("weather?", model="m", tools=[WEATHER, TIME], parallel_tool_calls=True,
                                 tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)))
    assert r.text == "" and [(c.index, c.name, c.arguments) for c in r.tool_calls] == [
        (0, "get_weather", '{"city": "Paris {x} [y]"}'), (1, "get_time", "{}")]
    assert r.final.choices[0].finish_reason == pb.FINISH_REASON_TOOL_CALLS
    schema = engine.samplings[0].json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    assert [a["properties"]["name"]["enum"] for a in schema["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    await collect(stub, chat("weather?", model="m", tools=[WEATHER, TIME],  # parallel_tool_calls false: one call
                             tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)))
    assert engine.samplings[1].json_schema["maxItems"] == 1


async def test_a_forced_tool_choice_with_a_response_format_is_refused(served):
    engine = ScriptedEngine(["{}"])
    stub = await served(engine)
    fmt = pb.ResponseFormat(json_schema=pb.JsonSchema(name="x", schema_json='{"type": "object"}'))
    for choice in (pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
                   pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_FUNCTION, function_name="get_weather")):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(stub, chat("weather?", model="m", tools=[WEATHER], tool_choice=choice, response_format=fmt))
        d = ErrorDetails.from_rpc_error(info.value)
        assert d.code == grpc.StatusCode.INVALID_ARGUMENT and d.field_violations[0][0] == "tool_choice"
    assert engine.started == []


async def test_a_prompt_that_opens_think_starts_the_output_as_reasoning(served):
    """A chat template that opens `<think>` itself (Qwen3 thinking, DeepSeek-R1-0528): the output
    holds only `</think>`; what comes before it is reasoning, not content."""
    engine = ScriptedEngine(["17 + 25", " = 42.", "</think>", "\n\nThe answer is 42."])
    engine.prompt_tail = "<|im_start|>assistant\n<think>\n"
    stub = await served(engine)
    r = await collect(stub, chat("sum?", model="m", parse_reasoning=True))
    assert (r.reasoning, r.text) == ("17 + 25 = 42.", "The answer is 42.")
    assert (r.final.usage.reasoning_tokens, r.final.usage.completion_tokens) == (3, 4)  # </think> counted in
    plain = await collect(stub, chat("sum?", model="m"))  # reasoning not asked for: all text, as before
    assert plain.text == "17 + 25 = 42.</think>\n\nThe answer is 42." and plain.reasoning == ""


async def test_cancel_by_id_ends_an_embed_at_the_engine():
    """The engines run an Embed's batch under ids of their own: Cancel by the call's id must end it
    (and a call made again after it runs at once, not after the supersede wait)."""
    engine = HeldEmbedder([])
    engine.hold.clear()
    worker = await serve_worker(engine)
    try:
        async with grpc.aio.insecure_channel(worker.address) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            call = stub.Embed(pb.EmbedRequest(model="m", inputs=["x"], request_id="e1"))
            await until(lambda: worker.servicer.gate.ongoing == 1, "the embed at the engine")
            reply = await stub.Cancel(pb.CancelRequest(request_ids=["e1"]))
            assert list(reply.cancelled) == ["e1"]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(call, 5)
            assert info.value.code() == grpc.StatusCode.CANCELLED
            await until(lambda: not worker.servicer.inflight and worker.servicer.gate.ongoing == 0, "it ended")
    finally:
        engine.hold.set()
        await worker.server.stop(0)
