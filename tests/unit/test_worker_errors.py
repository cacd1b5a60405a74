"""The worker's gRPC error edge: every `ServiceError` kind raised by a handler (unary or streaming,
before or after a first message) reaches the client whole through the real server construction
(`worker_server`: the ErrorInterceptor), and so do the real servicer's refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.worker.server import worker_server
from tests.engine_double import ScriptedEngine
from tests.grpc_serving import failure_of, serving, stream_failure_of
from tests.rpc_errors import ERROR_KINDS, assert_carries
from tests.worker_calls import chat, collect


class RaisingWorker(worker_pb2_grpc.WorkerServicer):
    """Raises `error` from every method: GetLoad (unary), Load (streaming, at once), Infer
    (streaming, after one event)."""

    def __init__(self, error: ServiceError) -> None:
        self.error = error

    async def GetLoad(self, request: pb.GetLoadRequest, context) -> pb.LoadReport:
        raise self.error

    async def Load(self, request: pb.LoadRequest, context) -> AsyncIterator[pb.LoadProgress]:
        raise self.error
        yield pb.LoadProgress()  # an async generator, like the real handler

    async def Infer(self, request: pb.InferRequest, context) -> AsyncIterator[pb.InferEvent]:
        yield pb.InferEvent(delta=pb.Delta(text="a"))
        raise self.error


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
async def test_every_error_kind_reaches_the_client_whole(kind: str):
    error = ERROR_KINDS[kind]
    async with serving(worker_server(RaisingWorker(error))) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        assert_carries(await failure_of(stub.GetLoad(pb.GetLoadRequest())), error)
        sent, err = await stream_failure_of(stub.Load(pb.LoadRequest()))
        assert sent == []
        assert_carries(err, error)
        sent, err = await stream_failure_of(stub.Infer(pb.InferRequest()))
        assert [e.delta.text for e in sent] == ["a"]
        assert_carries(err, error)


# ---- the real servicer's refusals, with the engine double ----------------------------------------

async def refusal(stub: worker_pb2_grpc.WorkerStub, request: pb.InferRequest) -> grpc.aio.AioRpcError:
    return await failure_of(collect(stub, request))


async def test_context_too_long(served):
    stub = await served(ScriptedEngine(["x"], max_model_len=10))
    err = await refusal(stub, chat("one two three four five", model="m", sampling=pb.SamplingParams(max_tokens=6)))
    assert_carries(err, ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT, Reason.CONTEXT_TOO_LONG,
        "this model's maximum context length is 10 tokens, but 11 were requested (5 in the prompt + 6 max_tokens)",
        field_violations=[("messages", "input is longer than the context")],
        metadata={"prompt_tokens": "5", "max_model_len": "10"}))


async def test_bad_parameter(served):
    stub = await served(ScriptedEngine(["x"]))
    err = await refusal(stub, pb.InferRequest(model="m", chat=pb.ChatInput()))
    assert_carries(err, invalid_parameter("messages", "messages must not be empty"))


async def test_not_ready(served):
    stub = await served(ScriptedEngine(["x"]), ready=False)
    err = await refusal(stub, chat("hi", model="m"))
    assert_carries(err, ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.NOT_READY, "model 'm' is still loading",
                                     retry_after_s=1.0))


async def test_overloaded(served):
    engine = ScriptedEngine(["a", "b"])
    engine.hold.clear()
    stub = await served(engine, max_ongoing=1)
    first = stub.Infer(chat("hi", model="m", request_id="r1"))
    await first.read()  # admitted, parked before its last chunk
    err = await refusal(stub, chat("hi", model="m", request_id="r2"))
    assert_carries(err, ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED,
                                     "this replica is at its limits (1 running, 0 queued)", retry_after_s=1.0))
    engine.hold.set()
    await first.read()  # the held request finishes normally
