"""Whether any node can host a model: its loader's capability resource on an alive node.

A model that no node can host is not a failed deploy: it stays pending, named with the missing
resource, until a node that advertises it joins (Ray then places the waiting replica)."""

from __future__ import annotations

from mship.common.v1 import common_pb2
from services.common.vocabulary import ENV_NODE_CAPABILITIES, capability_resource, loader_name
from services.coordinator.serve_control import NodeState


def unhostable(spec: common_pb2.ModelSpec, nodes: list[NodeState]) -> str | None:
    """Why no node can host `spec` now, or None when one can."""
    loader = loader_name(spec.loader)
    resource = capability_resource(loader)
    if any(n.alive and n.resources.get(resource, 0) > 0 for n in nodes):
        return None
    return (f"no alive node advertises the resource {resource}: join a node that can run {loader} "
            f"(`mship join`), or check its {ENV_NODE_CAPABILITIES}; the model starts when one joins")
