"""Which replicas a call's attempts go to, and for how long: never one that left the routes while
another was tried; a request no replica could take is refused once, not sent to each; the call's
timeout is its deadline across attempts and a cold start's wait. Real grpc.aio servers (the engine
double, or a servicer scripted for the case) and the real route table."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.errors import Reason, ServiceError
from services.common.infer import Attempts, UpstreamError, open_infer
from services.common.routes import RouteTable
from services.gateway.edge.upstream import from_grpc
from tests.engine_double import ScriptedEngine, serve_worker
from tests.unit.test_infer import MODEL, request, routing


class RefusingWorker(worker_pb2_grpc.WorkerServicer):
    """An older worker (no Deliver) that refuses every Infer with `refusal`, `after_s` into the
    call (after `on_call`), before any token: both refusals here are tried elsewhere."""

    def __init__(self, refusal: ServiceError, after_s: float) -> None:
        self.refusal, self.after_s = refusal, after_s
        self.on_call = lambda: None

    async def Infer(self, request, context):
        self.on_call()
        await asyncio.sleep(self.after_s)
        await context.abort_with_status(self.refusal.to_status())
        yield pb.InferEvent()

    async def Deliver(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "an older worker")
        yield pb.DeliveryBatch()


BUSY = ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.OVERLOADED, "busy", retry_after_s=1)
DIED = ServiceError(grpc.StatusCode.UNAVAILABLE, Reason.ENGINE_DIED, "engine stopped", retry_after_s=2)


async def test_a_replica_that_left_the_routes_while_another_was_tried_is_not_tried():
    """A call's candidates are chosen when it starts. A snapshot that arrives while the first one
    is tried (here it replaces B with C) must not send the call on to B, which left: it is still
    reachable (its channel stays open for its calls in flight), and may be a retired version."""
    b = await serve_worker(ScriptedEngine(["b", "b"]), name=MODEL)
    c = await serve_worker(ScriptedEngine(["c"]), name=MODEL)
    server = grpc.aio.server()
    table = RouteTable()

    def snapshot(version: int, *ports: int) -> cpb.RoutingSnapshot:
        snap = cpb.RoutingSnapshot(version=version)
        route = snap.models.add(name=MODEL, version="v1", max_model_len=64)
        for port in ports:
            replica = route.replicas.add(replica_id=f"r{port}", model=MODEL, version="v1")
            replica.endpoint.host, replica.endpoint.port = "127.0.0.1", port
        return snap

    refusing = RefusingWorker(BUSY, after_s=0.05)
    worker_pb2_grpc.add_WorkerServicer_to_server(refusing, server)
    a = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        table.apply(snapshot(1, a, b.port))
        b.engine.hold.clear()
        held = await open_infer(table, MODEL, request("held-on-b"))  # B is busier: A is tried first
        assert held.endpoint.address.endswith(f":{b.port}")
        refusing.on_call = lambda: table.apply(snapshot(2, a, c.port))
        stream = await open_infer(table, MODEL, request("new"))
        assert stream.endpoint.address.endswith(f":{c.port}") and "new" not in b.engine.started
        assert [e.delta.text async for e in stream if e.HasField("delta")] == ["c"]
        stream.close()
        held.close()
    finally:
        b.engine.hold.set()
        await table.close()
        for worker in (b, c):
            await worker.server.stop(0)
        await server.stop(0)


async def test_a_request_past_the_workers_message_limit_is_tried_once_and_is_a_413_not_overloaded():
    """gRPC's own RESOURCE_EXHAUSTED (a message larger than the worker takes; its limit is shrunk
    here to stand for 64 MiB) is not the worker's OVERLOADED: no replica could take it, so it is not
    sent to each in turn, and the client is told it is too large, not to retry."""
    servers, ports, calls = [], [], []

    class Counting(worker_pb2_grpc.WorkerServicer):
        async def Infer(self, request, context):
            calls.append(request.request_id)
            yield pb.InferEvent()

    for _ in range(3):
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 1000)])
        worker_pb2_grpc.add_WorkerServicer_to_server(Counting(), server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    table = routing(*ports)
    tried = []
    failed = Attempts.failed

    def counted(self, endpoint, e, started_at=None):
        tried.append(endpoint.address)
        return failed(self, endpoint, e, started_at)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Attempts, "failed", counted)
            big = pb.InferRequest(request_id="big", model=MODEL, prompt=pb.PromptInput(text="x" * 5000))
            with pytest.raises(UpstreamError) as e:
                await open_infer(table, MODEL, big)
        assert len(tried) == 1 and calls == []
        error = from_grpc(e.value.details, MODEL)
        assert (error.status, error.body()["error"]["code"], error.headers) == (413, "request_too_large", {})
    finally:
        await table.close()
        for server in servers:
            await server.stop(0)


async def test_a_calls_timeout_is_its_deadline_across_retries_and_a_cold_start():
    """`timeout_s` bounds the whole call: an attempt after a failed one gets what is left (here the
    second would fail at 0.8 s, past the 0.6 s deadline), and a cold start's wait ends with it."""
    servers, ports = [], []
    for _ in range(2):
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(RefusingWorker(DIED, after_s=0.4), server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    table = routing(*ports)
    idle = RouteTable()
    snapshot = cpb.RoutingSnapshot(version=1)
    snapshot.models.add(name=MODEL, version="v1", max_model_len=64, scale_to_zero=True)
    idle.apply(snapshot)
    idle.cold_start_timeout_s = 30
    try:
        for routes, timeout_s in ((table, 0.6), (idle, 0.2)):
            with pytest.raises(UpstreamError) as e:
                await asyncio.wait_for(open_infer(routes, MODEL, request("late"), timeout_s=timeout_s), 10)
            assert e.value.details.code == grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details
    finally:
        await table.close()
        await idle.close()
        for server in servers:
            await server.stop(0)


async def test_a_replica_address_that_now_serves_another_model_is_passed_over():
    """A replica gone and its port taken by another model's replica before the routes said so (the
    heartbeat window): its MODEL_NOT_FOUND is a stale route, not the client's error."""
    other = await serve_worker(ScriptedEngine(["x"]), name="another-model")
    right = await serve_worker(ScriptedEngine(["ok"]), name=MODEL)
    table = routing(other.port, right.port)
    try:
        table.routes[MODEL].endpoints[1].outstanding = 5  # the stale address is tried first
        stream = await open_infer(table, MODEL, request("r"))
        assert stream.endpoint.address.endswith(f":{right.port}")
        stream.close()
    finally:
        await table.close()
        for worker in (other, right):
            await worker.server.stop(0)
