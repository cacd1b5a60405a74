"""Delivery streams (`Deliver`): the deltas of an endpoint's Infer calls travel on one stream per
endpoint, each call keeps its own control. Against a real grpc.aio worker server (the platform's
servicer and interceptors) with a scripted engine: the code around the engine is what is tested."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common import delivery
from services.common.delivery import DeliveredCall
from services.common.infer import InferStream, UpstreamError, open_infer
from services.common.routes import CHANNEL_OPTIONS, Endpoint, RouteTable
from services.worker.delivery import MAX_BATCH, Delivery
from services.worker.server import SERVER_OPTIONS, WorkerServer, worker_server
from services.worker.servicer import WorkerServicer
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.unit.test_infer import MODEL, opened, request, routing

SCRIPT = ["one", " two", " three", " four"]


@pytest.fixture
async def worker() -> AsyncIterator[ServedWorker]:
    served = await serve_worker(ScriptedEngine(SCRIPT), name=MODEL, max_ongoing=64)
    try:
        yield served
    finally:
        served.engine.hold.set()
        await served.server.stop(0)


@pytest.fixture
async def table(worker: ServedWorker) -> AsyncIterator[RouteTable]:
    routes = routing(worker.port)
    try:
        yield routes
    finally:
        await routes.close()


def endpoint(table: RouteTable) -> Endpoint:
    return table.routes[MODEL].endpoints[0]


async def read_all(stream: InferStream) -> tuple[str, pb.Final]:
    text, final = "", None
    try:
        async for event in stream:
            if event.HasField("final"):
                final = event.final
            else:
                text += event.delta.text
    finally:
        stream.close()
    assert final is not None, "the stream ended without its Final"
    return text, final


def on_the_stream(final: pb.Final) -> bool:
    """The call's deltas all came on the delivery stream: as events, some merged on the worker (a
    delta that found the call's last one still waiting to go out)."""
    return 0 < final.delivered <= len(SCRIPT)


class NamingEngine(ScriptedEngine):
    """Every chunk names its request: a delta handed to the wrong call shows in that call's text."""

    async def generate(self, prompt, sampling, request_id, priority=0):
        async for step in super().generate(prompt, sampling, request_id, priority):
            yield replace(step, choices=[replace(c, text=f"{request_id}:{c.text}") for c in step.choices])


async def test_concurrent_calls_share_one_stream_each_gets_its_own_deltas(
        worker: ServedWorker, table: RouteTable) -> None:
    await opened(table)
    worker.servicer.host.engine = NamingEngine(SCRIPT)
    ids = [f"r{n}" for n in range(16)]
    streams = await asyncio.gather(*(open_infer(table, MODEL, request(rid)) for rid in ids))
    assert all(isinstance(s._call, DeliveredCall) for s in streams)
    results = await asyncio.gather(*(read_all(s) for s in streams))
    for rid, (text, final) in zip(ids, results, strict=True):
        assert text == "".join(f"{rid}:{chunk}" for chunk in SCRIPT)
        assert on_the_stream(final)  # every delta came on the delivery stream, none on the call
        assert final.usage.completion_tokens == len(SCRIPT)
    assert endpoint(table).outstanding == 0


async def test_the_first_call_carries_its_deltas_itself(table: RouteTable) -> None:
    stream = await open_infer(table, MODEL, request("first"))
    text, final = await read_all(stream)
    assert (text, final.delivered) == ("".join(SCRIPT), 0)


async def test_an_engine_failure_after_deltas_reaches_the_caller_after_them(
        worker: ServedWorker, table: RouteTable) -> None:
    await opened(table)
    worker.engine.fail_at = 2  # after "one", " two"
    stream = await open_infer(table, MODEL, request("fails"))
    assert isinstance(stream._call, DeliveredCall)
    text = ""
    with pytest.raises(UpstreamError) as e:
        async for event in stream:
            text += event.delta.text
    stream.close()
    assert text == "one two"
    assert (e.value.details.reason, e.value.details.metadata.get(delivery.DELIVERED)) == ("ENGINE_ERROR", "2")


async def test_closing_a_call_aborts_its_engine_request_and_leaves_the_others(
        worker: ServedWorker, table: RouteTable) -> None:
    await opened(table)
    worker.engine.hold.clear()  # every request parks before its last chunk
    gone = await open_infer(table, MODEL, request("gone"))
    kept = await open_infer(table, MODEL, request("kept"))
    gone.close()
    await until(lambda: "gone" in worker.engine.cancelled or "gone" in worker.engine.aborted,
                "the engine request of the closed call ended")
    worker.engine.hold.set()
    text, final = await read_all(kept)
    assert text == "".join(SCRIPT) and on_the_stream(final)
    await until(lambda: not worker.servicer.inflight, "the worker holds no request")
    assert endpoint(table).delivery._queues == {}


async def test_a_broken_delivery_stream_fails_its_calls_as_unavailable(
        worker: ServedWorker, table: RouteTable) -> None:
    reader = await opened(table)
    worker.engine.hold.clear()
    stream = await open_infer(table, MODEL, request("cut"))
    assert isinstance(stream._call, DeliveredCall)
    reader._call.cancel()  # the stream breaks (as when its connection does)
    with pytest.raises(UpstreamError) as e:
        await read_all(stream)
    assert e.value.details.code == grpc.StatusCode.UNAVAILABLE
    worker.engine.hold.set()
    await until(lambda: not worker.servicer.inflight, "the worker's request ended")
    await until(lambda: not worker.servicer.deliveries._open, "the worker closed its end")
    again = await open_infer(table, MODEL, request("after"))  # served, on the call until it reopens
    assert (await read_all(again))[0] == "".join(SCRIPT)


async def test_a_call_naming_an_unknown_stream_carries_its_deltas(worker: ServedWorker) -> None:
    async with grpc.aio.insecure_channel(worker.address) as channel:
        req = request("stray")
        req.delivery.id, req.delivery.tag = "no-such-stream", 7
        events = [e async for e in worker_pb2_grpc.WorkerStub(channel).Infer(req)]
    assert "".join(e.delta.text for e in events[:-1]) == "".join(SCRIPT)
    assert events[-1].final.delivered == 0


async def test_a_worker_without_deliver_gets_calls_that_carry_their_deltas_until_it_is_upgraded(
        worker: ServedWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older worker answers `Deliver` UNIMPLEMENTED: its calls carry their deltas, and it is not
    asked again at each call. Upgraded in place (the same address), it is asked again after
    `ASK_AGAIN_S` and its calls' deltas go on the stream."""
    monkeypatch.setattr(delivery, "ASK_AGAIN_S", 0.5)

    class OlderWorker(WorkerServicer):
        Deliver = worker_pb2_grpc.WorkerServicer.Deliver  # the generated one: UNIMPLEMENTED

    older = worker_server(OlderWorker(worker.servicer.host, worker.servicer.gate))
    port = older.add_insecure_port("127.0.0.1:0")
    await older.start()
    table = routing(port)
    upgraded: grpc.aio.Server | None = None
    try:
        for n in range(3):
            text, final = await read_all(await open_infer(table, MODEL, request(f"old{n}")))
            assert (text, final.delivered) == ("".join(SCRIPT), 0)
        reader = endpoint(table).delivery
        await until(lambda: reader._task is None, "the caller learnt the worker has no Deliver")
        assert (await read_all(await open_infer(table, MODEL, request("old3"))))[1].delivered == 0
        assert reader._task is None  # not asked again at once
        await older.stop(0)
        upgraded = worker_server(WorkerServicer(worker.servicer.host, worker.servicer.gate))
        assert upgraded.add_insecure_port(f"127.0.0.1:{port}") == port
        await upgraded.start()
        deadline = time.monotonic() + 10
        while True:  # each call: on the stream once the reader asks again and the channel reconnected
            try:
                if (await read_all(await open_infer(table, MODEL, request("new"))))[1].delivered > 0:
                    break
            except UpstreamError:
                pass  # the channel still reconnecting to the new server
            assert time.monotonic() < deadline, "the upgraded worker's calls never went on its stream"
            await asyncio.sleep(0.05)
    finally:
        await table.close()
        await older.stop(0)
        if upgraded is not None:
            await upgraded.stop(0)


async def test_stopping_a_worker_ends_its_delivery_streams_once_their_calls_ended(
        worker: ServedWorker, table: RouteTable) -> None:
    reader = await opened(table)
    worker.engine.hold.clear()
    stream = await open_infer(table, MODEL, request("last"))
    stopping = asyncio.ensure_future(WorkerServer(worker.server, worker.servicer.host, worker.servicer,
                                                  worker.port).stop(grace_s=60))
    await until(lambda: worker.servicer.deliveries._closing, "the worker began to stop")
    assert reader.is_open and not stopping.done()  # a call still sends on it
    worker.engine.hold.set()
    text, final = await read_all(stream)
    assert text == "".join(SCRIPT) and on_the_stream(final)
    await asyncio.wait_for(stopping, 10)  # not the 60 s grace: the stream ended after its last call


async def test_a_stopping_worker_ends_a_stream_whose_last_call_sent_and_left_in_one_step() -> None:
    delivery = Delivery()
    delivery.attached = 1
    batches = delivery.batches()
    assert (await anext(batches)).delivery_id == delivery.id
    delivery.close_when_idle()
    delivery.send(1, pb.InferEvent(delta=pb.Delta(text="last")))
    delivery.detach()  # before the stream's task ran again: one wake-up for both
    assert [e.delta.text for e in (await anext(batches)).events] == ["last"]
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(batches), 5)


async def test_a_backlog_goes_out_in_bounded_messages() -> None:
    delivery = Delivery()
    batches = delivery.batches()
    await anext(batches)
    for n in range(MAX_BATCH + 3):  # a call each: nothing to merge
        delivery.send(n, pb.InferEvent(delta=pb.Delta(text=str(n))))
    first, second = await anext(batches), await anext(batches)
    assert (len(first.events), len(second.events)) == (MAX_BATCH, 3)
    assert [e.delta.text for e in (*first.events, *second.events)] == [str(n) for n in range(MAX_BATCH + 3)]
    assert list(second.tags) == list(range(MAX_BATCH, MAX_BATCH + 3))


def delta(n: int, choice: int = 0, reasoning: bool = False) -> pb.InferEvent:
    text = pb.Delta(index=choice, reasoning=str(n)) if reasoning else pb.Delta(index=choice, text=str(n))
    text.token_count = 1
    return pb.InferEvent(delta=text)


async def test_deltas_waiting_behind_a_lagging_caller_merge_per_call_and_choice() -> None:
    """While gRPC still writes the last message, each call's deltas merge into its last waiting one of
    the same choice: what waits grows with the calls, not by an event per token, and the Final counts
    the events that go out. Once the message is taken, the next delta is an event of its own."""
    delivery = Delivery()
    batches = delivery.batches()
    await anext(batches)
    keys = [(1, 0), (2, 0), (2, 1)]  # (call's tag, choice)
    sent = [delivery.send(tag, delta(n, choice)) for n in range(10_000) for tag, choice in keys]
    assert sum(sent) == 3
    batch = await anext(batches)
    assert list(batch.tags) == [1, 2, 2]
    whole = "".join(str(n) for n in range(10_000))
    assert [(e.delta.index, e.delta.text, e.delta.token_count) for e in batch.events] == [
        (0, whole, 10_000), (0, whole, 10_000), (1, whole, 10_000)]
    assert delivery.send(1, delta(7)) is True  # nothing of the call waits any more: never held back
    assert delivery.send(1, delta(8, reasoning=True)) is True  # reasoning after text stays in its order
    assert delivery.send(1, delta(9, reasoning=True)) is False
    assert [(e.delta.text, e.delta.reasoning) for e in (await anext(batches)).events] == [("7", ""), ("", "89")]


async def test_a_replica_leaving_the_routes_keeps_its_calls_then_its_stream_ends(
        worker: ServedWorker, table: RouteTable) -> None:
    reader = await opened(table)
    worker.engine.hold.clear()
    stream = await open_infer(table, MODEL, request("leaving"))
    table.apply(cpb.RoutingSnapshot(version=2))  # a cutover: the replica is no longer routed
    assert not reader.is_open  # no new call uses it
    worker.engine.hold.set()
    text, final = await read_all(stream)
    assert text == "".join(SCRIPT) and on_the_stream(final)
    await until(lambda: not worker.servicer.deliveries._open, "the stream ended after its last call")


def _scaled(options: list[tuple[str, object]], drop: str = "") -> list[tuple[str, object]]:
    """The same gRPC options with every ping and keepalive interval 100× shorter (`drop`: one left out)."""
    return [(k, v // 100 if isinstance(v, int) and ("ping" in k or "keepalive" in k) and k.endswith("_ms") else v)
            for k, v in options if k != drop]


async def _idle_stream_survives(server_options: list[tuple[str, object]], window_s: float) -> bool:
    """Whether a server stream that sends nothing after its first message stays open for `window_s`
    on a channel with the callers' options (100× faster), pinging at its keepalive time."""
    async def idle(_: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield b"open"
        await asyncio.Event().wait()

    server = grpc.aio.server(options=server_options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Idle", {"Stream": grpc.unary_stream_rpc_method_handler(idle)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    # Without data a client pings twice, then once a minute; here at its keepalive time (the strikes' pace).
    client = [*_scaled(CHANNEL_OPTIONS), ("grpc.http2.max_pings_without_data", 0)]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=client) as channel:
            call = channel.unary_stream("/t.Idle/Stream")(b"")
            assert await call.read() == b"open"
            try:
                await asyncio.wait_for(call.read(), window_s)
            except TimeoutError:
                return True
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE and "ping" in (e.details() or "").lower(), e
                return False
            raise AssertionError("the idle stream sent a message")
    finally:
        await server.stop(0)


async def test_the_worker_accepts_the_keepalive_pings_of_an_idle_delivery_stream() -> None:
    """An idle delivery stream is a call in flight, so its channel pings the worker without data. The
    worker server's options (every interval 100× shorter) accept those pings through a window in
    which gRPC's default policy (the ping option left out: the control) answers GOAWAY "too many
    pings" (after ~3 s here). gRPC ignores a misspelt option key; the control shows this test sees it."""
    key = "grpc.http2.min_ping_interval_without_data_ms"
    platform, control = await asyncio.gather(_idle_stream_survives(_scaled(SERVER_OPTIONS), 8.0),
                                             _idle_stream_survives(_scaled(SERVER_OPTIONS, drop=key), 8.0))
    assert (platform, control) == (True, False)
