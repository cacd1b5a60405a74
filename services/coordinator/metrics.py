"""The coordinator's Prometheus series (docs/metrics.md): deploys by outcome, the routing version,
replicas per model and state, how long loaders wait for a node's load lease. The gauges are the
live coordinator's (`livemostrecent`): a dead one's leave with it (a restarted coordinator never
sets a model it does not route, whose last replica states would otherwise stay for ever)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from mship.coordinator.v1 import coordinator_pb2 as pb

DEPLOYS = Counter("mship_coordinator_deploys", "deploys that ended, by outcome", ["outcome"])
ROUTING_VERSION = Gauge("mship_coordinator_routing_version", "the routing table's version",
                        multiprocess_mode="livemostrecent")
REPLICAS = Gauge("mship_coordinator_replicas", "registered worker replicas of the routed version, by state "
                 "(ready | unhealthy | unresponsive)", ["model", "state"], multiprocess_mode="livemostrecent")
LEASE_WAIT = Histogram("mship_coordinator_lease_wait_seconds", "a loader's wait for its node's load lease",
                       buckets=(0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600))
OUTCOMES = {pb.DEPLOY_STATE_SUCCEEDED: "succeeded", pb.DEPLOY_STATE_FAILED: "failed",
            pb.DEPLOY_STATE_CANCELLED: "cancelled"}
STATES = ("ready", "unhealthy", "unresponsive")
for _outcome in OUTCOMES.values():  # at 0 from the start: an alert's increase() sees the first one
    DEPLOYS.labels(_outcome)
