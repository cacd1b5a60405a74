"""The registry's per-replica health, load and limits (heartbeats), and models autoscaled to zero:
an unhealthy replica leaves routing at once and its model is `unhealthy` when none is left; a model
at zero replicas is routed with no endpoints (not pending); heartbeats hand out the current limits."""

from __future__ import annotations

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.common.limits import replica_limits
from services.coordinator.registry import ActiveModel, ReplicaRegistry


def replica(rid: str, model: str = "chat", version: str = "v1") -> pb.ReplicaInfo:
    return pb.ReplicaInfo(replica_id=rid, model=model, version=version, max_model_len=512,
                          endpoint=common_pb2.Endpoint(host="127.0.0.1", port=1))


async def test_an_unhealthy_replica_leaves_routing_and_a_model_with_none_healthy_is_unhealthy():
    registry = ReplicaRegistry()
    await registry.set_active("chat", ActiveModel("v1", common_pb2.USECASE_GENERATE))
    for rid in ("a", "b"):
        await registry.register(replica(rid))
    version = registry.version
    await registry.heartbeat(pb.HeartbeatRequest(replica_id="a", unhealthy=True))
    assert registry.version > version  # pushed at once, not at the next unrelated change
    snap = registry.snapshot()
    assert [r.replica_id for r in snap.models[0].replicas] == ["b"] and list(snap.unhealthy) == []
    assert registry.state_of(registry.replicas["a"]) == "unhealthy"
    await registry.heartbeat(pb.HeartbeatRequest(replica_id="b", unhealthy=True))
    snap = registry.snapshot()
    assert (list(snap.models), list(snap.unhealthy), list(snap.pending)) == ([], ["chat"], [])
    version = registry.version
    await registry.heartbeat(pb.HeartbeatRequest(replica_id="b", unhealthy=True))
    assert registry.version == version  # no change, no push
    await registry.heartbeat(pb.HeartbeatRequest(replica_id="b"))
    assert [r.replica_id for r in registry.snapshot().models[0].replicas] == ["b"]


async def test_a_model_autoscaled_to_zero_is_routed_without_replicas_and_is_not_pending():
    registry = ReplicaRegistry()
    spec = common_pb2.ModelSpec(name="idle", max_model_len=256)
    spec.autoscaling.CopyFrom(common_pb2.AutoscalingConfig(min_replicas=0, max_replicas=2))
    await registry.set_active("idle", ActiveModel.of(spec, "v1"))
    snap = registry.snapshot()
    assert (snap.models[0].name, snap.models[0].scale_to_zero, list(snap.models[0].replicas)) == ("idle", True, [])
    assert (snap.models[0].max_model_len, list(snap.pending)) == (256, [])
    spec.autoscaling.min_replicas = 1  # at least one replica: none is pending, as before
    await registry.set_active("idle", ActiveModel.of(spec, "v1"))
    assert (list(registry.snapshot().models), list(registry.snapshot().pending)) == ([], ["idle"])


async def test_heartbeats_record_load_and_hand_out_the_routed_versions_limits():
    registry = ReplicaRegistry()
    spec = common_pb2.ModelSpec(name="chat", max_ongoing_requests=2, max_queued_requests=0)
    await registry.set_active("chat", ActiveModel.of(spec, "v1"))
    await registry.register(replica("a"))
    await registry.register(replica("old", version="v0"))
    limits = await registry.heartbeat(pb.HeartbeatRequest(replica_id="a", running_requests=2, waiting_requests=0))
    assert limits == common_pb2.ReplicaLimits(max_ongoing_requests=2, max_queued_requests=0)
    assert registry.replicas["a"].load.running_requests == 2
    assert await registry.heartbeat(pb.HeartbeatRequest(replica_id="old")) == replica_limits(None)  # its own spec's
    assert await registry.heartbeat(pb.HeartbeatRequest(replica_id="gone")) is None  # unknown: register again


async def test_a_leaving_replica_is_routed_while_its_version_takes_traffic_and_not_once_retired():
    """What a replica that stops is told (HeartbeatResponse.routed): Serve stopping a replica of the
    version that serves (a downscale) lets its streams finish; a version a deploy switched away from
    or removed had that deploy's drain."""
    registry = ReplicaRegistry()
    await registry.set_active("chat", ActiveModel("v1", common_pb2.USECASE_GENERATE))
    await registry.register(replica("a", version="v1"))
    await registry.register(replica("b", version="v2"))
    assert registry.routed("a") and not registry.routed("b")  # b: the new version, not switched to yet
    await registry.set_active("chat", ActiveModel("v2", common_pb2.USECASE_GENERATE))
    assert not registry.routed("a") and registry.routed("b")
    await registry.set_active("chat", None)
    assert not registry.routed("b") and not registry.routed("nobody")
