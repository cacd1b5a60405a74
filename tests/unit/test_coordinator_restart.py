"""A restarted coordinator's take-over (`recovery.take_over`, fake Serve, the same state service):
deploys wait for it, the committed spec (not the replicas' start spec) is adopted, a committed
model at zero replicas stays deployed, and a version a restart orphaned is deleted."""

from __future__ import annotations

import asyncio

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deployer import Deployer
from services.coordinator.fingerprint import app_name, version_of
from services.coordinator.recovery import take_over
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.servicer import CoordinatorServicer
from tests.helpers import until
from tests.serve_control_fake import DeployRig, messages
from tests.serve_control_fake import model_spec as spec


class Restarted:
    """A new coordinator (registry, deployer, servicer) over the rig's Serve and committed set;
    Serve's replicas register with it from now on."""

    def __init__(self, rig: DeployRig) -> None:
        self.rig, self.old = rig, rig.registry
        self.registry = ReplicaRegistry()
        self.deployer = Deployer(self.registry, rig.serve, "127.0.0.1:1", commit=rig._commit,
                                 committed=rig._committed, load_timeout_s=2.0, drain_poll_s=0.002)
        self.servicer = CoordinatorServicer(self.registry, self.deployer, None, rig.serve)  # type: ignore[arg-type]
        rig.serve.registry = self.registry

    def take_over(self, wait_s: float = 5.0) -> asyncio.Task:
        async def ready() -> None:
            self.servicer.routing_ready.set()

        return asyncio.create_task(take_over(self.registry, self.deployer, self.rig.serve, self.rig._committed,
                                             [], wait_s, ready))

    async def reregister(self) -> None:
        """The replicas that ran under the old coordinator register with this one."""
        for replica in list(self.old.replicas.values()):
            await self.registry.register(replica.info)

    def route(self, name: str) -> str | None:
        active = self.registry.active.get(name)
        return active.version if active else None


async def test_a_deploy_sent_during_the_take_over_waits_for_it_then_replaces_the_adopted_version():
    async with DeployRig() as rig:
        await rig.deploy(spec("a"), spec("b"))
        new = Restarted(rig)
        taking_over = new.take_over()
        await asyncio.sleep(0)  # the take-over holds the deploys back from its first step
        record = new.deployer.start(pb.DeployRequest(models=[spec("a", 768)]))
        await until(lambda: messages(record), "the deploy says what it waits for")
        assert messages(record)[0].startswith("queued behind the coordinator's recovery")
        await new.reregister()
        await asyncio.wait_for(taking_over, 5)
        await asyncio.wait_for(record.task, 5)  # type: ignore[arg-type]
        assert record.state == pb.DEPLOY_STATE_SUCCEEDED
        assert new.route("a") == version_of(spec("a", 768)) and new.route("b") == version_of(spec("b"))
        assert rig.serve.app_of("a") == [app_name(spec("a", 768))]  # the adopted version was replaced
        assert sorted((s.name, s.max_model_len) for s in rig.commits[-1]) == [("a", 768), ("b", 512)]


async def test_a_reconcile_sent_during_the_take_over_removes_what_it_omits():
    async with DeployRig() as rig:
        await rig.deploy(spec("a"), spec("b"))
        new = Restarted(rig)
        taking_over = new.take_over()
        await asyncio.sleep(0)
        record = new.deployer.start(pb.DeployRequest(models=[spec("b")], mode=pb.DEPLOY_MODE_RECONCILE))
        await new.reregister()
        await asyncio.wait_for(taking_over, 5)
        await asyncio.wait_for(record.task, 5)  # type: ignore[arg-type]
        assert [m.spec.name for m in new.deployer.running_models()] == ["b"]
        assert rig.serve.app_of("a") == [] and [s.name for s in rig.commits[-1]] == ["b"]


async def test_the_committed_spec_is_adopted_with_its_rescale_and_limits():
    async with DeployRig() as rig:
        await rig.deploy(spec("a"))
        changed = spec("a", replicas=2)
        changed.rate_limits.requests_per_minute = 10
        changed.max_ongoing_requests = 3
        await rig.deploy(changed)  # in place: the replicas still hold the spec they started with
        new = Restarted(rig)
        await new.reregister()
        await asyncio.wait_for(new.take_over(), 5)
        adopted = new.deployer.running_models()[0].spec
        assert adopted == changed
        assert new.registry.snapshot().models[0].rate_limits.requests_per_minute == 10
        replica_id = next(iter(new.registry.replicas))
        limits = await new.registry.heartbeat(pb.HeartbeatRequest(replica_id=replica_id))
        assert limits is not None and limits.max_ongoing_requests == 3
        heal = new.deployer.start(pb.DeployRequest(use_committed=True, mode=pb.DEPLOY_MODE_RECONCILE))
        await asyncio.wait_for(heal.task, 5)  # type: ignore[arg-type]
        assert heal.state == pb.DEPLOY_STATE_SUCCEEDED
        assert not [c for c in rig.serve.calls if c[0] == "rescale" and c[2] == 1]  # not scaled back down


async def test_a_committed_model_at_zero_replicas_stays_deployed_and_wakes():
    async with DeployRig() as rig:
        idle = common_pb2.ModelSpec(name="idle", model="builtin:tiny-qwen2",
                                    autoscaling=common_pb2.AutoscalingConfig(min_replicas=0, max_replicas=2))
        await rig.deploy(idle, spec("b"))
        await rig.serve.drift(app_name(idle), 0)  # Serve's autoscaler took it to zero
        new = Restarted(rig)
        await new.reregister()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(new.take_over(wait_s=30), 5)
        assert loop.time() - started < 5  # an app at zero has no replica to wait for
        assert [m.spec.name for m in new.deployer.running_models()] == ["b", "idle"]
        assert new.route("idle") == version_of(idle) and "idle" not in new.registry.snapshot().pending
        reply = await new.servicer.RequestReplica(pb.RequestReplicaRequest(model="idle"), None)
        assert reply.starting
        await until(lambda: new.registry.live("idle", version_of(idle)), "the woken replica registers")


async def test_a_version_the_restart_orphaned_is_deleted_and_the_committed_one_serves():
    async with DeployRig() as rig:
        await rig.deploy(spec("a"))
        v2 = spec("a", 768)  # the old coordinator had loaded it, then died before the switch
        await rig.serve.submit({app_name(v2): (v2, version_of(v2))}, "127.0.0.1:1")
        new = Restarted(rig)
        await new.reregister()
        await asyncio.wait_for(new.take_over(wait_s=1), 5)
        assert new.route("a") == version_of(spec("a"))
        assert rig.serve.app_of("a") == [app_name(spec("a"))]


async def test_without_a_committed_set_what_has_replicas_is_adopted_and_nothing_is_deleted():
    async with DeployRig() as rig:
        await rig.deploy(spec("a"))
        v2 = spec("a", 768)
        await rig.serve.submit({app_name(v2): (v2, version_of(v2))}, "127.0.0.1:1")
        rig.commits.clear()  # the state service lost the committed set
        new = Restarted(rig)
        await new.reregister()
        await asyncio.wait_for(new.take_over(wait_s=1), 5)
        assert [m.spec.name for m in new.deployer.running_models()] == ["a"]
        assert len(rig.serve.app_of("a")) == 2
