"""Per-node load leases over the coordinator's real gRPC API, held by the worker's real `node_lease`:
loaders on one node take turns, loaders on different nodes do not wait for each other, and a loader
killed while it holds the lease (SIGKILL: no release) loses it at its TTL so the next one proceeds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.coordinator.deployer import Deployer
from services.coordinator.leases import LeaseManager
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.server import coordinator_server
from services.coordinator.servicer import CoordinatorServicer
from services.worker.registration import node_lease
from tests.platform_process import ROOT
from tests.serve_control_fake import FakeServe

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
TTL_S = 1.0

# A loader in its own process: takes the lease, says so, then "loads" until it is killed.
LOADER = """
import asyncio, sys
from services.worker.registration import node_lease

async def main(coordinator, ttl_s):
    async with node_lease(coordinator, "node-a", "doomed", ttl_s=ttl_s):
        print("held", flush=True)
        await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


@pytest.fixture
async def coordinator() -> AsyncIterator[str]:
    registry = ReplicaRegistry(heartbeat_timeout_s=3.5)
    serve = FakeServe(registry)  # deploys are not under test here
    servicer = CoordinatorServicer(registry, Deployer(registry, serve, "unused"), LeaseManager(), serve)
    server, port = coordinator_server(servicer, "127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def leases(coordinator: str) -> list[pb.LeaseRecord]:
    async with grpc.aio.insecure_channel(coordinator) as channel:
        reply = await coordinator_pb2_grpc.CoordinatorStub(channel).ListLeases(pb.ListLeasesRequest(), timeout=5)
    return list(reply.leases)


async def load(coordinator: str, node: str, holder: str, seconds: float) -> None:
    async with node_lease(coordinator, node, holder, ttl_s=TTL_S):
        await asyncio.sleep(seconds)  # stands for the model load the lease serialises


async def test_loads_on_one_node_take_turns_and_nodes_are_independent(coordinator):
    await asyncio.gather(load(coordinator, "node-a", "r1", 0.3), load(coordinator, "node-a", "r2", 0.3),
                         load(coordinator, "node-a", "r3", 0.3), load(coordinator, "node-b", "r4", 0.3))
    records = await leases(coordinator)
    on_a = sorted((r for r in records if r.node_id == "node-a"), key=lambda r: r.granted_at)
    assert sorted(r.holder for r in on_a) == ["r1", "r2", "r3"]
    assert all(r.end == pb.LEASE_END_RELEASED for r in records)
    for first, second in itertools.pairwise(on_a):
        assert first.ended_at <= second.granted_at  # never two loads at once on node-a
    (on_b,) = [r for r in records if r.node_id == "node-b"]
    assert on_b.granted_at < on_a[0].ended_at  # node-b loaded while node-a's first load ran


async def test_a_killed_loader_loses_the_lease_at_its_ttl(coordinator):
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", LOADER, coordinator, str(TTL_S), cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE,
                                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"held\n"
        proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        await proc.wait()
        await asyncio.wait_for(load(coordinator, "node-a", "next", 0.0), timeout=TTL_S + 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    doomed, following = sorted(await leases(coordinator), key=lambda r: r.granted_at)
    assert (doomed.holder, doomed.end) == ("doomed", pb.LEASE_END_EXPIRED)
    assert (following.holder, following.end) == ("next", pb.LEASE_END_RELEASED)
    # It expired by itself (no release), after the kill, within one TTL, and only then did the next go.
    assert killed_at - 0.1 <= doomed.ended_at <= killed_at + TTL_S + 0.1
    assert doomed.ended_at <= following.granted_at
