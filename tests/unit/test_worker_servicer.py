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


@pytest.fixture
async def served():
    async def start(engine: ScriptedEngine, *, ready: bool = True, max_ongoing: int = 8):
        worker = await serve_worker(engine, ready=ready, max_ongoing=max_ongoing)
        servers.append(worker.server)
        channel = grpc.aio.insecure_channel(worker.address)
        channels.append(channel)
        return worker_pb2_grpc.WorkerStub(channel)

    servers: list[grpc.aio.Server] = []
    channels: list[grpc.aio.Channel] = []
    yield start
    for channel in channels:
        await channel.close()
    for server in servers:
        await server.stop(0)


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
