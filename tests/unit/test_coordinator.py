"""Coordinator pieces that need no Ray: lease bookkeeping and the reasons a deploy reports."""

from __future__ import annotations

import socket

import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.executor import failure_reason
from services.coordinator.leases import HISTORY, LeaseManager
from services.coordinator.planner import RunningModel
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.servicer import CoordinatorServicer
from tests.helpers import until

SERVE_FAILURE = """The deployment failed to start 3 times in a row. This may be due to a problem with its \
constructor or initial health check failing. See controller logs for details. Error:
ray::ServeReplica:mship-model-swap-1a2b:worker.initialize_and_get_metadata() (pid=7, ip=127.0.0.1)
Traceback (most recent call last):
  File "/work/services/worker/host.py", line 52, in resolve_model
    raise FileNotFoundError(f"model path {ref} does not exist on this node")
FileNotFoundError: model path /nope does not exist on this node"""


def test_failure_reason_keeps_the_first_sentence_and_the_exception():
    assert failure_reason(SERVE_FAILURE) == ("The deployment failed to start 3 times in a row: "
                                             "FileNotFoundError: model path /nope does not exist on this node")
    assert failure_reason("  not ready within 900s  ") == "not ready within 900s"


async def test_lease_records_say_how_each_lease_ended():
    leases = LeaseManager()
    first = await leases.acquire("n", "a", ttl_s=0.05, wait_s=0)
    second = await leases.acquire("n", "b", ttl_s=5, wait_s=1)  # granted once a's lease expires
    assert second is not None and second.lease_id != first.lease_id
    await leases.release(second.lease_id)
    a, b = leases.records()
    assert (a.holder, a.end) == ("a", pb.LEASE_END_EXPIRED) and a.ended_at <= b.granted_at
    assert (b.holder, b.end) == ("b", pb.LEASE_END_RELEASED) and b.ended_at >= b.granted_at
    held = await leases.acquire("m", "c", ttl_s=5, wait_s=0)
    assert leases.records("m")[0].end == pb.LEASE_END_UNSPECIFIED and held is not None


async def test_lease_history_is_bounded():
    leases = LeaseManager()
    for i in range(HISTORY + 10):
        lease = await leases.acquire("n", f"h{i}", ttl_s=5, wait_s=0)
        await leases.release(lease.lease_id)
    records = leases.records()
    assert len(records) == HISTORY and records[-1].holder == f"h{HISTORY + 9}"


async def test_a_coordinator_whose_port_is_taken_fails_and_tears_down_cleanly():
    from services.coordinator.deployment import CoordinatorDeployment  # imports Ray Serve: only here

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        coordinator_class = CoordinatorDeployment.func_or_class  # the class Serve constructs

        class Probe(coordinator_class):
            def __del__(self) -> None:  # the test runs the async teardown itself, once
                pass

        coordinator = Probe.__new__(Probe)
        with pytest.raises((OSError, RuntimeError), match="bind"):
            await coordinator.__init__("127.0.0.1", port, "127.0.0.1:1")
        await coordinator_class.__del__(coordinator)  # what Serve runs next: no AttributeError


class OneModelAtZero:
    """The deployer of one model autoscaled to zero, and Serve's control, whose wakes fail."""

    def __init__(self) -> None:
        spec = common_pb2.ModelSpec(name="idle", autoscaling=common_pb2.AutoscalingConfig(min_replicas=0))
        self.model, self.wakes = RunningModel(spec, "v1", "app-idle"), 0

    def running_models(self) -> list[RunningModel]:
        return [self.model]

    async def wake(self, app: str) -> None:
        self.wakes += 1
        raise RuntimeError("no node has the memory")


async def test_a_wake_that_failed_answers_the_next_asks_then_is_tried_again():
    """Gateways waiting for a cold start are told at once that none will start, with why, instead
    of each waiting out its bound; after WAKE_RETRY_S the model is woken again."""
    cluster = OneModelAtZero()
    servicer = CoordinatorServicer(ReplicaRegistry(), cluster, None, cluster)  # type: ignore[arg-type]
    servicer.routing_ready.set()
    ask = pb.RequestReplicaRequest(model="idle")
    assert (await servicer.RequestReplica(ask, None)).starting
    await until(lambda: not servicer._waking, "the wake to fail")
    refused = await servicer.RequestReplica(ask, None)
    assert not refused.starting and "no node has the memory" in refused.reason and cluster.wakes == 1
    servicer._wake_failed["app-idle"] = (refused.reason, 0.0)  # its time has passed
    assert (await servicer.RequestReplica(ask, None)).starting
    await until(lambda: cluster.wakes == 2, "the second wake")
