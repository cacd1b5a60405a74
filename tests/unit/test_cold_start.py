"""A call to a model autoscaled to zero (services/common/routes.py `RouteTable.cold_start`): it asks
the coordinator for a replica once, however many calls wait, and goes on when a snapshot routes to
one; past its bound it gives up (the edge answers 503 + Retry-After)."""

from __future__ import annotations

import asyncio

import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.worker.v1 import worker_pb2 as pb
from services.common.infer import UpstreamError, open_infer
from services.common.routes import REASK_S, RouteTable
from services.gateway.edge.upstream import from_grpc


def snapshot(version: int, replicas: int) -> cpb.RoutingSnapshot:
    route = cpb.ModelRoute(name="idle", version="v1", scale_to_zero=True, replicas=[
        cpb.ReplicaInfo(replica_id=f"r{i}", endpoint=common_pb2.Endpoint(host="127.0.0.1", port=40000 + i))
        for i in range(replicas)])
    return cpb.RoutingSnapshot(version=version, models=[route])


async def test_waiting_calls_ask_once_and_go_on_when_a_replica_is_routed():
    table = RouteTable()
    table.apply(snapshot(1, 0))
    asked: list[str] = []
    started = asyncio.Event()

    async def request_replica(model: str) -> None:
        asked.append(model)
        started.set()

    table.request_replica = request_replica
    waits = [asyncio.create_task(table.cold_start("idle")) for _ in range(3)]
    await started.wait()
    table.apply(snapshot(2, 0))  # another change, still no replica: they keep waiting
    await asyncio.sleep(0)
    assert not any(w.done() for w in waits)
    table.apply(snapshot(3, 1))
    results = await asyncio.gather(*waits)
    assert [[e.address for e in r] for r in results] == [["127.0.0.1:40000"]] * 3
    assert asked == ["idle"]
    await table.close()


async def test_a_cold_start_gives_up_at_its_bound_and_a_model_that_stopped_scaling_to_zero_at_once():
    table = RouteTable()
    table.cold_start_timeout_s = 0.05
    table.apply(snapshot(1, 0))
    assert await table.cold_start("idle") == []  # nobody to ask (no watcher): waits its bound, then gives up
    table.cold_start_timeout_s = 30
    wait = asyncio.create_task(table.cold_start("idle"))
    await asyncio.sleep(0)
    table.apply(cpb.RoutingSnapshot(version=2))  # removed meanwhile
    assert await asyncio.wait_for(wait, 5) == []
    await table.close()


async def test_a_cancel_that_comes_with_the_snapshot_it_waited_for_is_kept():
    """The client's disconnect cancels a call waiting for a snapshot in the very turn one applies:
    the call must end cancelled (3.11's `asyncio.wait_for` lost such a cancel, and the generation
    went on for nobody)."""
    table = RouteTable()
    table.apply(snapshot(1, 0))
    for wait in (lambda: table.wait_newer(1, 30), lambda: table.cold_start("idle")):
        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0)
        table.apply(snapshot(table.version + 1, 0))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await table.close()


async def test_a_start_the_coordinator_refuses_ends_the_waits_at_once_and_says_why():
    """A wake that failed (nowhere to place the model), or a model the coordinator no longer
    serves at zero: the calls answer now, naming why, not at the end of their bound; the
    coordinator is asked again after REASK_S."""
    table = RouteTable()
    table.apply(snapshot(1, 0))
    table.cold_start_timeout_s = 30
    asked: list[str] = []

    async def refusing(model: str) -> None:
        asked.append(model)
        table.refuse_start(model, "starting a replica failed: no node has the memory")

    table.request_replica = refusing
    waits = [asyncio.ensure_future(table.cold_start("idle")) for _ in range(3)]
    assert await asyncio.wait_for(asyncio.gather(*waits), 5) == [[], [], []]
    assert await table.cold_start("idle") == [] and asked == ["idle"]  # not asked again so soon
    with pytest.raises(UpstreamError) as e:
        await open_infer(table, "idle", pb.InferRequest(model="idle"))
    assert "none will start: starting a replica failed: no node has the memory" in e.value.details.message
    error = from_grpc(e.value.details, "idle")  # what the HTTP client reads: why, and when to try again
    assert error.status == 503 and "none can start now: starting a replica failed: no node has the memory" \
        in error.body()["error"]["message"]
    assert 1 < int(error.headers["Retry-After"]) <= REASK_S  # when the coordinator is asked again, not 1 s
    table._asked["idle"] -= REASK_S  # later: asked again
    assert await asyncio.wait_for(table.cold_start("idle"), 5) == [] and asked == ["idle", "idle"]
    await table.close()
