"""What a deploy changes: the running set and a request in, a plan out. Pure: no I/O, no Serve.

Per model: same version -> unchanged (or rescaled in place when only the scale differs, or when
Serve's live replica count drifted from the spec's; re-limited when only the admission limits differ:
the gateways get the new rate limits with the next routing version, the replicas their backpressure
limits with their next heartbeat, nothing reloads); a new name or a
changed version -> added
(a new Serve app, loaded beside the old one); reconcile mode also removes what the request omits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.fingerprint import limits_of, version_of

DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass
class RunningModel:
    spec: common_pb2.ModelSpec
    version: str
    app: str
    load_time_s: float = 0.0


@dataclass
class Plan:
    add: dict[str, tuple[common_pb2.ModelSpec, str]] = field(default_factory=dict)  # name -> (spec, version)
    rescale: dict[str, common_pb2.ModelSpec] = field(default_factory=dict)
    relimit: dict[str, common_pb2.ModelSpec] = field(default_factory=dict)  # only admission limits changed
    remove: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S


def plan_deploy(running: Mapping[str, RunningModel], request: pb.DeployRequest,
                serve_targets: Mapping[str, int]) -> Plan:
    """The plan that takes `running` to `request`; `serve_targets` is each Serve app's target
    replica count as Serve holds it now (for drift)."""
    plan = Plan(drain_timeout_s=request.drain_timeout_s if request.HasField("drain_timeout_s")
                else DEFAULT_DRAIN_TIMEOUT_S)
    wanted = {spec.name: spec for spec in request.models}
    for name, spec in wanted.items():
        version = version_of(spec)
        current = running.get(name)
        if current is None or current.version != version:
            plan.add[name] = (spec, version)
        elif scale_of(current.spec) != scale_of(spec):
            plan.rescale[name] = spec
        elif drifted(current, serve_targets):
            # The same config again restores a fixed replica count that drifted from it in Serve.
            plan.rescale[name] = spec  # same scale as running; its rate limits may be new
        elif limits_of(current.spec) != limits_of(spec):
            plan.relimit[name] = spec
        else:
            plan.unchanged.append(name)
    if request.mode == pb.DEPLOY_MODE_RECONCILE:
        plan.remove = sorted(set(running) - set(wanted))
    return plan


def drifted(model: RunningModel, serve_targets: Mapping[str, int]) -> bool:
    """A fixed replica count that Serve's deployment no longer runs (autoscaled ones float by design)."""
    if model.spec.HasField("autoscaling"):
        return False
    target = serve_targets.get(model.app)
    return target is not None and target != model.spec.num_replicas


def needs_serve_targets(running: Mapping[str, RunningModel]) -> bool:
    """Whether planning needs Serve's targets at all (only a fixed replica count can drift)."""
    return any(not m.spec.HasField("autoscaling") for m in running.values())


def scale_of(spec: common_pb2.ModelSpec) -> tuple[int, bytes]:
    return spec.num_replicas, spec.autoscaling.SerializeToString(deterministic=True)


def specs_of(running: Mapping[str, RunningModel]) -> dict[str, bytes]:
    """The running set's specs, comparable (did a deploy change what runs?)."""
    return {name: m.spec.SerializeToString(deterministic=True) for name, m in running.items()}
