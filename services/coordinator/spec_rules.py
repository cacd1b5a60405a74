"""What the coordinator accepts in a deploy: a request from any gRPC caller, not only the CLI
(whose models.yaml parser checks the same), is refused before anything runs when a spec can never
be right; each refusal names the field (`models[i].field`)."""

from __future__ import annotations

import math

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.common.errors import ServiceError, invalid_parameter
from services.common.vocabulary import MODEL_NAME


def check_deploy(request: pb.DeployRequest) -> None:
    """Refuse a deploy that cannot be right (INVALID_ARGUMENT naming the field); normalize the
    rest in place (`normalize`)."""
    if request.use_committed and request.models:
        raise invalid_parameter("models", "use_committed deploys the stored set: pass no models")
    names = [spec.name for spec in request.models]
    if len(set(names)) != len(names):
        raise invalid_parameter("models", "model names must be distinct")
    if not request.models and request.mode != pb.DEPLOY_MODE_RECONCILE and not request.use_committed:
        raise invalid_parameter("models", "an additive deploy needs at least one model")
    if request.HasField("drain_timeout_s") and not _non_negative(request.drain_timeout_s):
        raise invalid_parameter("drain_timeout_s", "drain_timeout_s must be a number >= 0 (0: no drain)")
    for i, spec in enumerate(request.models):
        check_spec(spec, f"models[{i}]")
        normalize(spec)


def check_spec(spec: common_pb2.ModelSpec, where: str) -> None:
    if not MODEL_NAME.match(spec.name):
        raise _invalid(where, "name", f"{spec.name!r} is not a valid model name: letters, digits and . _ : - "
                       "(at most 64 characters, starting with a letter or digit)")
    if not spec.model.strip():
        raise _invalid(where, "model", "model is required: builtin:NAME, a Hugging Face id or a local path")
    for field in ("num_cpus", "num_gpus", "stall_timeout_s"):
        if not _non_negative(getattr(spec, field)):
            raise _invalid(where, field, f"{field} must be a number >= 0")
    if spec.HasField("autoscaling"):
        scaling = spec.autoscaling
        if spec.num_replicas:
            raise _invalid(where, "num_replicas", "num_replicas and autoscaling exclude each other: keep one")
        if scaling.max_replicas < max(1, scaling.min_replicas):
            raise _invalid(where, "autoscaling.max_replicas",
                           "autoscaling.max_replicas must be at least 1 and at least min_replicas")
        for field in ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s"):
            if not _non_negative(getattr(scaling, field)):
                raise _invalid(where, f"autoscaling.{field}", f"autoscaling.{field} must be a number >= 0")


def normalize(spec: common_pb2.ModelSpec) -> None:
    """A fixed replica count of 0 is the field left unset: 1 (0 would scale the model away)."""
    if not spec.HasField("autoscaling") and spec.num_replicas == 0:
        spec.num_replicas = 1


def _non_negative(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _invalid(where: str, field: str, message: str) -> ServiceError:
    return invalid_parameter(f"{where}.{field}", f"{where}: {message}")
