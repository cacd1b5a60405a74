"""`mship status [--json]`: nodes, models with their replicas, and what is pending, from the
coordinator's ClusterStatus (plus ListModels and Serve's own apps in the text form).

JSON (stable keys, docs/multi-node.md):
  {"nodes": [{"node_id", "name", "address", "alive", "is_head", "capabilities", "resources"}],
   "models": [{"name", "version", "replicas": [{"replica_id", "node_id", "endpoint", "state",
               "running_requests", "queued_requests", "max_ongoing_requests", "max_queued_requests"}]}],
   "pending": [{"name", "reason"}]}
"""

from __future__ import annotations

import json
from typing import Any

from mship.coordinator.v1 import coordinator_pb2 as pb


def status_json(reply: pb.ClusterStatusResponse) -> dict[str, Any]:
    return {
        "nodes": [{"node_id": n.node_id, "name": n.name, "address": n.address, "alive": n.alive,
                   "is_head": n.is_head, "capabilities": list(n.capabilities), "resources": dict(n.resources)}
                  for n in reply.nodes],
        "models": [{"name": m.name, "version": m.version,
                    "replicas": [{"replica_id": r.replica_id, "node_id": r.node_id, "endpoint": r.endpoint,
                                  "state": r.state, "running_requests": r.running_requests,
                                  "queued_requests": r.queued_requests,
                                  "max_ongoing_requests": r.limits.max_ongoing_requests,
                                  "max_queued_requests": r.limits.max_queued_requests} for r in m.replicas]}
                   for m in reply.models],
        "pending": [{"name": p.name, "reason": p.reason} for p in reply.pending],
    }


def dumps(reply: pb.ClusterStatusResponse) -> str:
    return json.dumps(status_json(reply), indent=2, sort_keys=True)


def status_text(reply: pb.ClusterStatusResponse) -> list[str]:
    """The same content as the JSON, for people."""
    lines = ["nodes:"]
    for n in reply.nodes:
        role = "head" if n.is_head else "node"
        cpus = n.resources.get("CPU", 0)
        lines.append(f"  {n.name or n.node_id[:12]:<24} {role:<5} {'alive' if n.alive else 'dead':<6} "
                     f"{n.address:<16} id {n.node_id[:12]}  cpus {cpus:g}  "
                     f"capabilities {','.join(n.capabilities) or 'none'}")
    lines.append("models:")
    for m in reply.models:
        lines.append(f"  {m.name:<24} version {m.version}  replicas {len(m.replicas)}")
        for r in m.replicas:
            lines.append(f"    replica {r.replica_id:<12} {r.endpoint:<22} node {r.node_id[:12]}  {r.state:<12} "
                         f"running {r.running_requests}/{r.limits.max_ongoing_requests}  "
                         f"queued {r.queued_requests}/{r.limits.max_queued_requests}")
    for p in reply.pending:
        lines.append(f"pending: {p.name}: {p.reason}")
    return lines
