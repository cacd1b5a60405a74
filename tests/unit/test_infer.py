"""`open_infer` / `InferStream` keep `Endpoint.outstanding` balanced: each call is counted once
while it is open and taken back exactly once however it ends (served, refused and retried
elsewhere, cancelled while waiting for its first event, closed twice)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.delivery import DeliveryReader
from services.common.infer import UpstreamError, call_unary, open_infer
from services.common.picker import PrefixAffinity
from services.common.routes import RouteTable
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.tcp_proxy import TcpProxy

MODEL = "m"


def routing(*ports: int) -> RouteTable:
    """A table routing MODEL to replicas on these local ports, in this order."""
    table = RouteTable()
    snapshot = cpb.RoutingSnapshot(version=1)
    route = snapshot.models.add(name=MODEL, version="v1", max_model_len=64)
    for i, port in enumerate(ports):
        replica = route.replicas.add(replica_id=f"r{i}", model=MODEL, version="v1")
        replica.endpoint.host, replica.endpoint.port = "127.0.0.1", port
    table.apply(snapshot)
    return table


async def opened(table: RouteTable) -> DeliveryReader:
    """The endpoint's delivery stream, open (the first call opens it and carries its own deltas)."""
    stream = await open_infer(table, MODEL, request("opens-the-stream"))
    try:
        events = [e async for e in stream]
    finally:
        stream.close()
    assert events[-1].HasField("final"), "the stream ended without its Final"
    reader = table.routes[MODEL].endpoints[0].delivery
    await until(lambda: reader.is_open, "the delivery stream opened")
    return reader


@pytest.fixture
async def routed() -> AsyncIterator[tuple[list[ServedWorker], RouteTable]]:
    """Two replicas of MODEL (the second not ready), routed in one table."""
    workers = [await serve_worker(ScriptedEngine(["a", "b"]), name=MODEL),
               await serve_worker(ScriptedEngine(["a", "b"]), name=MODEL, ready=False)]
    table = routing(*(w.port for w in workers))
    try:
        yield workers, table
    finally:
        for worker in workers:
            worker.engine.first_hold.set()
        await table.close()
        for worker in workers:
            await worker.server.stop(0)


def request(request_id: str) -> pb.InferRequest:
    return pb.InferRequest(request_id=request_id, model=MODEL, prompt=pb.PromptInput(text="hi"))


def outstanding(table: RouteTable) -> list[int]:
    return [e.outstanding for e in table.routes[MODEL].endpoints]


async def test_a_served_stream_counts_until_it_is_closed_once(routed):
    _, table = routed
    for n in range(4):  # whichever replica is tried first, the ready one serves it
        stream = await open_infer(table, MODEL, request(f"r{n}"))
        assert sorted(outstanding(table)) == [0, 1]
        assert [e.WhichOneof("event") async for e in stream] == ["delta", "delta", "final"]
        stream.close()
        stream.close()
        assert outstanding(table) == [0, 0]


async def test_cancelled_while_waiting_for_the_first_event(routed):
    (ready, _), table = routed
    ready.engine.first_hold.clear()
    table.routes[MODEL].endpoints[1].outstanding = 10  # the ready replica is tried first
    opening = asyncio.create_task(open_infer(table, MODEL, request("gone")))
    await until(lambda: ready.engine.started == ["gone"], "the engine request to start")
    assert outstanding(table) == [1, 10]
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert outstanding(table) == [0, 10]
    await until(lambda: ready.engine.cancelled == ["gone"], "the engine request to be cancelled")


async def test_refusals_are_taken_back(routed):
    (ready, _), table = routed
    ready.engine.fail = True  # INTERNAL: not retried elsewhere
    table.routes[MODEL].endpoints[1].outstanding = 10
    with pytest.raises(UpstreamError) as info:
        await open_infer(table, MODEL, request("boom"))
    assert info.value.details.code == grpc.StatusCode.INTERNAL and outstanding(table) == [0, 10]
    table.routes[MODEL].endpoints[1].outstanding = 0
    table.routes[MODEL].endpoints[0].outstanding = 10  # the loading replica first: UNAVAILABLE, then the other
    with pytest.raises(UpstreamError):
        await open_infer(table, MODEL, request("boom2"))
    assert outstanding(table) == [10, 0]


async def test_calls_that_share_a_prefix_reach_one_replica():
    """The table's picker gets each call's prefix key: one system prompt per identity -> one replica."""
    workers = [await serve_worker(ScriptedEngine(["a"]), name=MODEL) for _ in range(2)]
    table = RouteTable(PrefixAffinity())
    snapshot = cpb.RoutingSnapshot(version=1)
    route = snapshot.models.add(name=MODEL, version="v1", max_model_len=64)
    for i, worker in enumerate(workers):
        replica = route.replicas.add(replica_id=f"r{i}", model=MODEL, version="v1")
        replica.endpoint.host, replica.endpoint.port = "127.0.0.1", worker.port
    table.apply(snapshot)

    async def call(identity: str, question: str) -> None:
        chat = pb.ChatInput(messages=[pb.ChatMessage(role="system", content=f"You help {identity}."),
                                      pb.ChatMessage(role="user", content=question)])
        stream = await open_infer(table, MODEL, pb.InferRequest(
            request_id=f"{identity}:{question}", model=MODEL, chat=chat, cache_salt=identity))
        [e async for e in stream]
        stream.close()

    try:
        served: dict[str, set[int]] = {}
        for identity in (f"id{i}" for i in range(12)):
            for question in ("q1", "q2", "q3"):
                await call(identity, question)
            served[identity] = {i for i, w in enumerate(workers) if any(r.startswith(f"{identity}:")
                                                                         for r in w.engine.started)}
        assert all(len(replicas) == 1 for replicas in served.values())  # each identity stays on one replica
        assert set().union(*served.values()) == {0, 1}  # and the identities use both
    finally:
        await table.close()
        for worker in workers:
            await worker.server.stop(0)


class DroppingWorker(worker_pb2_grpc.WorkerServicer):
    """A replica on its way out: gRPC ends its calls CANCELLED, with no reason (as when its process
    stops under them), not the worker's own refusal."""

    def __init__(self) -> None:
        self.calls = 0

    async def Infer(self, request, context):
        self.calls += 1
        await context.abort(grpc.StatusCode.CANCELLED, "the server is going away")
        yield pb.InferEvent()  # never reached: makes this a streaming handler


async def test_a_call_its_replica_drops_before_the_first_event_is_answered_by_another():
    dropping, server = DroppingWorker(), grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(dropping, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready = await serve_worker(ScriptedEngine(["a", "b"]), name=MODEL)
    table = routing(port, ready.port)
    try:
        table.routes[MODEL].endpoints[1].outstanding = 10  # the dropping replica is tried first
        stream = await open_infer(table, MODEL, request("moved"))
        assert [e.WhichOneof("event") async for e in stream] == ["delta", "delta", "final"]
        stream.close()
        assert dropping.calls == 1 and outstanding(table) == [0, 10]
        assert ready.engine.started == ["moved"]
        assert table.breaker._circuits[f"127.0.0.1:{port}"].failures == 1  # counted like an unreachable one
    finally:
        await table.close()
        await ready.server.stop(0)
        await server.stop(0)


def reroute(table: RouteTable, version: int, *ports: int) -> None:
    """A newer snapshot routing MODEL to these ports (a cutover: the old replicas are gone)."""
    snapshot = cpb.RoutingSnapshot(version=version)
    route = snapshot.models.add(name=MODEL, version=f"v{version}", max_model_len=64)
    for i, port in enumerate(ports):
        replica = route.replicas.add(replica_id=f"v{version}-r{i}", model=MODEL, version=f"v{version}")
        replica.endpoint.host, replica.endpoint.port = "127.0.0.1", port
    table.apply(snapshot)


async def stopped_port() -> int:
    """A local port whose server has stopped: a call there fails UNAVAILABLE at once."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await server.stop(0)
    return port


async def test_a_call_whose_replicas_all_left_waits_for_the_snapshot_that_replaced_them():
    """The gateway's snapshot trails a cutover: the only replica it knows has stopped. The call
    fails there, then is answered by the replica of the snapshot that arrives while it waits."""
    gone, new = await stopped_port(), await serve_worker(ScriptedEngine(["a"]), name=MODEL)
    table = routing(gone)
    try:
        opening = asyncio.create_task(open_infer(table, MODEL, request("cutover")))
        await until(lambda: f"127.0.0.1:{gone}" in table.breaker._circuits, "the stopped replica to fail")
        assert not opening.done()  # waiting for a newer snapshot, not answered 503
        reroute(table, 2, new.port)
        stream = await opening
        assert [e.WhichOneof("event") async for e in stream] == ["delta", "final"]
        stream.close()
        assert new.engine.started == ["cutover"]
    finally:
        await table.close()
        await new.server.stop(0)


async def test_a_unary_call_finds_the_replicas_of_a_snapshot_that_arrived_meanwhile():
    """The snapshot moved on while the call was failing on its old replica: tried at once."""
    gone, new = await stopped_port(), await serve_worker(ScriptedEngine(["a"]), name=MODEL)
    table = routing(gone)
    table.refresh_wait_s = 0.0  # nothing to wait for: the newer snapshot is already applied

    async def embed(endpoint):
        if endpoint.address == f"127.0.0.1:{gone}":
            reroute(table, 2, new.port)  # arrives while this call is in flight
        return await endpoint.stub.GetLoad(pb.GetLoadRequest(), timeout=5)

    try:
        reply = await call_unary(table, MODEL, embed)
        assert reply.model == MODEL and [e.address for e in table.routes[MODEL].endpoints] == [f"127.0.0.1:{new.port}"]
    finally:
        await table.close()
        await new.server.stop(0)


async def test_without_a_newer_snapshot_the_call_is_refused_after_the_wait():
    gone = await stopped_port()
    table = routing(gone)
    table.refresh_wait_s = 0.05
    try:
        with pytest.raises(UpstreamError) as info:
            await open_infer(table, MODEL, request("nowhere"))
        assert info.value.details.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await table.close()


async def made_again_after_its_connection_broke(delivery_open: bool) -> None:
    worker = await serve_worker(ScriptedEngine(["a", "b"]), name=MODEL)
    proxy = await TcpProxy(worker.port).start()
    table = routing(proxy.port)
    address = f"127.0.0.1:{proxy.port}"
    aborted: list[str] = []
    abort = worker.engine.abort
    worker.engine.abort = lambda ids: aborted.extend(ids) or abort(ids)  # type: ignore[method-assign]
    try:
        if delivery_open:
            await opened(table)
        worker.engine.first_hold.clear()
        opening = asyncio.create_task(open_infer(table, MODEL, request("cut")))
        await until(lambda: worker.engine.started.count("cut") == 1, "the call to reach the engine")
        proxy.cut()
        await until(lambda: worker.engine.started.count("cut") == 2 or opening.done(), "the call to be made again")
        worker.engine.first_hold.set()
        stream = await opening  # not refused: made again through a new connection
        assert proxy.connections == 2
        assert [e.WhichOneof("event") async for e in stream] == ["delta", "delta", "final"]
        stream.close()
        # The first attempt's engine request ended: cancelled with its call, or aborted by the
        # second one when that came before the worker saw the connection go.
        assert worker.engine.cancelled + aborted == ["cut"]
        assert address not in table.breaker._circuits  # its success reset the failure count
        await until(lambda: not worker.servicer.inflight, "the worker to finish")
    finally:
        worker.engine.first_hold.set()
        await table.close()
        await proxy.close()
        await worker.server.stop(0)


async def test_a_call_whose_connection_broke_before_the_first_event_is_made_again_on_its_one_replica():
    """One replica, and the connection to it breaks under a call still waiting for its first event
    (a GOAWAY, a reset): the channel reconnects at once, so the call is made there once more, not
    refused 503. Before, it waited for a newer snapshot and was refused."""
    await made_again_after_its_connection_broke(delivery_open=False)


async def test_a_call_made_again_after_its_delivery_stream_broke_waits_for_the_channel_to_know():
    """The same with the endpoint's delivery stream open, as in steady state. The stream was
    sending, so it usually learns of the break first; a call made again at once went out on the
    dead connection and was refused, until the failing call waited for its own end. Repeated,
    since the race is one of timing: without that wait 3 of 3 runs failed here, with it 5 of 5 passed."""
    for _ in range(60):
        await made_again_after_its_connection_broke(delivery_open=True)


async def test_one_broken_connection_is_one_failure_for_the_breaker_whatever_ran_on_it():
    """Four streams on one connection, which breaks: each fails, and the replica is not left out
    of rotation for it (three failures would open its circuit), since its channel reconnects."""
    worker = await serve_worker(ScriptedEngine(["a", "b"]), name=MODEL)
    proxy = await TcpProxy(worker.port).start()
    table = routing(proxy.port)
    try:
        worker.engine.hold.clear()  # each parks before its last chunk
        streams = [await open_infer(table, MODEL, request(f"s{n}")) for n in range(4)]
        proxy.cut()
        for stream in streams:
            with pytest.raises(UpstreamError) as e:
                async for _ in stream:
                    pass
            stream.close()
            assert e.value.details.code == grpc.StatusCode.UNAVAILABLE
        assert table.breaker._circuits[f"127.0.0.1:{proxy.port}"].failures == 1
        assert table.breaker.excluded() == set()
    finally:
        worker.engine.hold.set()
        await table.close()
        await proxy.close()
        await worker.server.stop(0)


async def test_a_replica_that_refuses_is_not_asked_again():
    """The same-replica retry is for broken connections only: a worker's own UNAVAILABLE (here: not
    ready) names its reason, and the call is refused after one try there."""
    loading = await serve_worker(ScriptedEngine(["a"]), name=MODEL, ready=False)
    table = routing(loading.port)
    table.refresh_wait_s = 0.05
    calls = []
    original = table.routes[MODEL].endpoints[0].delivery.infer

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    table.routes[MODEL].endpoints[0].delivery.infer = counted
    try:
        with pytest.raises(UpstreamError) as info:
            await open_infer(table, MODEL, request("loading"))
        assert info.value.details.reason == "NOT_READY" and len(calls) == 1
    finally:
        await table.close()
        await loading.server.stop(0)

