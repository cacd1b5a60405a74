"""A model's backpressure limits per replica, defaults resolved in this one place (the model-set
parser, the coordinator that hands them out in heartbeats, and the worker that applies them), and
whether it may run at zero replicas."""

from __future__ import annotations

from mship.common.v1 import common_pb2

DEFAULT_MAX_ONGOING_REQUESTS = 64  # requests one replica's engine works on at once
DEFAULT_MAX_QUEUED_REQUESTS = 256  # requests waiting for one of those places


def scales_to_zero(spec: common_pb2.ModelSpec) -> bool:
    """Autoscaled with min_replicas 0: no replica is normal, and a request waits for a cold start."""
    return spec.HasField("autoscaling") and spec.autoscaling.min_replicas == 0


def replica_limits(spec: common_pb2.ModelSpec | None) -> common_pb2.ReplicaLimits:
    if spec is None:
        return common_pb2.ReplicaLimits(max_ongoing_requests=DEFAULT_MAX_ONGOING_REQUESTS,
                                        max_queued_requests=DEFAULT_MAX_QUEUED_REQUESTS)
    return common_pb2.ReplicaLimits(
        max_ongoing_requests=spec.max_ongoing_requests if spec.HasField("max_ongoing_requests")
        else DEFAULT_MAX_ONGOING_REQUESTS,
        max_queued_requests=spec.max_queued_requests if spec.HasField("max_queued_requests")
        else DEFAULT_MAX_QUEUED_REQUESTS)
