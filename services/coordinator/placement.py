"""Whether any node can host a model: its loader's capability resource, and as many CPUs and GPUs
as one replica asks for, on one alive node.

A model that no node can host is not a failed deploy: it stays pending, named with what is missing,
until a node that has it joins (Ray then places the waiting replica)."""

from __future__ import annotations

from mship.common.v1 import common_pb2
from services.common.vocabulary import DEFAULT_REPLICA_CPUS, ENV_NODE_CAPABILITIES, capability_resource, loader_name
from services.coordinator.serve_control import NodeState


def unhostable(spec: common_pb2.ModelSpec, nodes: list[NodeState]) -> str | None:
    """Why no node can host `spec` now, or None when one can."""
    loader = loader_name(spec.loader)
    resource = capability_resource(loader)
    capable = [n for n in nodes if n.alive and n.resources.get(resource, 0) > 0]
    if not capable:
        return (f"no alive node advertises the resource {resource}: join a node that can run {loader} "
                f"(`mship join`), or check its {ENV_NODE_CAPABILITIES}; the model starts when one joins")
    cpus, gpus = spec.num_cpus or DEFAULT_REPLICA_CPUS, spec.num_gpus
    if any(n.resources.get("CPU", 0) >= cpus and n.resources.get("GPU", 0) >= gpus for n in capable):
        return None
    most_cpus = max(n.resources.get("CPU", 0) for n in capable)
    most_gpus = max(n.resources.get("GPU", 0) for n in capable)
    return (f"one replica asks for {cpus:g} CPUs and {gpus:g} GPUs, and no alive node that can run {loader} has "
            f"that many (at most {most_cpus:g} CPUs, {most_gpus:g} GPUs): join a larger node, or lower "
            "num_cpus / num_gpus; the model starts when one joins")
