"""`unless_disconnected`: the work is cancelled when the client goes, and also when the handler
itself is cancelled (the server cancels the handler task): the worker call must not outlive it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import open_infer
from services.common.routes import RouteTable
from services.gateway.edge.disconnect import ClientDisconnected, unless_disconnected
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until

MODEL = "m"
pytestmark = pytest.mark.timeout(30)


class HttpRequest:
    """The part of a Starlette request `unless_disconnected` reads: `receive()`, which reports
    `http.disconnect` once `disconnect()` is called."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def disconnect(self) -> None:
        self.gone.set()


@pytest.fixture
async def worker() -> AsyncIterator[tuple[ServedWorker, RouteTable]]:
    """One replica whose engine never sends a first token (until released), routed in a table."""
    engine = ScriptedEngine(["never"])
    engine.first_hold.clear()
    served = await serve_worker(engine, name=MODEL)
    table = RouteTable()
    snapshot = cpb.RoutingSnapshot(version=1)
    replica = snapshot.models.add(name=MODEL, version="v1", max_model_len=64).replicas.add(
        replica_id="r0", model=MODEL, version="v1")
    replica.endpoint.host, replica.endpoint.port = "127.0.0.1", served.port
    table.apply(snapshot)
    try:
        yield served, table
    finally:
        engine.first_hold.set()
        await table.close()
        await served.server.stop(0)


def infer(request_id: str) -> pb.InferRequest:
    return pb.InferRequest(request_id=request_id, model=MODEL, prompt=pb.PromptInput(text="hi"))


async def test_a_cancelled_handler_cancels_the_worker_call(worker):
    served, table = worker
    endpoint = table.routes[MODEL].endpoints[0]
    work = open_infer(table, MODEL, infer("r-cancel"))
    handler = asyncio.ensure_future(unless_disconnected(HttpRequest().receive, work))
    await until(lambda: "r-cancel" in served.engine.started, "the engine to start the request")
    assert endpoint.outstanding == 1
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert endpoint.outstanding == 0  # the work task was cancelled and awaited with the handler
    await until(lambda: "r-cancel" in served.engine.cancelled, "the worker to see the cancellation")


async def test_a_disconnect_cancels_the_worker_call(worker):
    served, table = worker
    endpoint = table.routes[MODEL].endpoints[0]
    http = HttpRequest()
    handler = asyncio.ensure_future(unless_disconnected(http.receive, open_infer(table, MODEL, infer("r-gone"))))
    await until(lambda: "r-gone" in served.engine.started, "the engine to start the request")
    http.disconnect()
    with pytest.raises(ClientDisconnected):
        await handler
    assert endpoint.outstanding == 0
    await until(lambda: "r-gone" in served.engine.cancelled, "the worker to see the cancellation")


async def test_the_work_result_is_returned(worker):
    served, table = worker
    served.engine.first_hold.set()
    stream = await unless_disconnected(HttpRequest().receive, open_infer(table, MODEL, infer("r-ok")))
    try:
        assert [e async for e in stream][-1].HasField("final")
    finally:
        stream.close()
    assert table.routes[MODEL].endpoints[0].outstanding == 0
