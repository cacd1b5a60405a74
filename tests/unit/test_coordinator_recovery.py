"""A restarted coordinator adopts the platform that still runs: Serve's apps, the re-registered
replicas and (where a cutover was interrupted) the committed version."""

from __future__ import annotations

import asyncio

import grpc

from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deployer import Deployer
from services.coordinator.fingerprint import app_name, version_of
from services.coordinator.recovery import adoptable, recover
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.serve_control import AppState
from tests.serve_control_fake import DeployRig
from tests.serve_control_fake import model_spec as spec


def replica(model_spec, replica_id: str) -> pb.ReplicaInfo:
    return pb.ReplicaInfo(replica_id=replica_id, model=model_spec.name, version=version_of(model_spec),
                          spec=model_spec)


def test_the_committed_version_wins_where_two_run_and_gone_apps_are_skipped():
    v1, v2, gone = spec("a"), spec("a", 768), spec("b")
    apps = {app_name(s): AppState("RUNNING", "", 1) for s in (v1, v2)}
    replicas = [replica(v1, "r1"), replica(v2, "r2"), replica(gone, "r3")]
    assert {n: m.version for n, m in adoptable(replicas, apps, [v2]).items()} == {"a": version_of(v2)}
    assert {n: m.version for n, m in adoptable(replicas[::-1], apps, [v1]).items()} == {"a": version_of(v1)}
    assert list(adoptable(replicas, apps, [])) == ["a"]  # no committed set: the first one seen


async def unavailable():
    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


async def test_a_new_deployer_waits_for_the_replicas_to_re_register_then_adopts_and_routes_them():
    async with DeployRig() as rig:
        await rig.deploy(spec("a", replicas=2), spec("b"))
        registry = ReplicaRegistry()  # the restarted coordinator's: the replicas re-register with it
        restarted = Deployer(registry, rig.serve, "127.0.0.1:1")
        recovering = asyncio.create_task(recover(registry, restarted, rig.serve, unavailable, wait_s=30.0))
        for info in rig.registry.live("a", version_of(spec("a"))) + rig.registry.live("b", version_of(spec("b"))):
            await asyncio.sleep(0)  # a replica at a time, while `recover` waits
            assert not recovering.done() and restarted.running_models() == []
            await registry.register(info)
        await asyncio.wait_for(recovering, 5)  # every app has a replica back: no need to wait 30 s
        assert [(m.spec.name, m.app) for m in restarted.running_models()] == [
            ("a", app_name(spec("a"))), ("b", app_name(spec("b")))]
        assert [(m.name, len(m.replicas)) for m in registry.snapshot().models] == [("a", 2), ("b", 1)]


async def test_an_app_whose_replicas_do_not_come_back_is_left_unrouted_after_the_wait():
    async with DeployRig() as rig:
        await rig.deploy(spec("a"), spec("b"))
        registry = ReplicaRegistry()
        for info in rig.registry.live("a", version_of(spec("a"))):
            await registry.register(info)
        restarted = Deployer(registry, rig.serve, "127.0.0.1:1")
        await recover(registry, restarted, rig.serve, unavailable, wait_s=0.05)
        assert [m.spec.name for m in restarted.running_models()] == ["a"]
        assert [m.name for m in registry.snapshot().models] == ["a"]


async def test_nothing_running_is_nothing_to_adopt():
    async with DeployRig() as rig:
        async def never():
            raise AssertionError("the committed set is read only when apps run")

        await recover(rig.registry, rig.deployer, rig.serve, never, wait_s=1.0)
        assert rig.deployer.running_models() == [] and rig.registry.active == {}
