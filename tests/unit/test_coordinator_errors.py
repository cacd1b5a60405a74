"""Errors the coordinator raises reach its callers intact through its real server construction
(the shared interceptors): every `ServiceError` kind from a unary and a streaming method, and the
real servicer's refusals (unknown deploy, duplicate names)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.coordinator.leases import LeaseManager
from services.coordinator.server import coordinator_server
from services.coordinator.servicer import CoordinatorServicer
from tests.rpc_errors import ERROR_KINDS, assert_carries
from tests.serve_control_fake import DeployRig
from tests.serve_control_fake import model_spec as spec


class Raising(coordinator_pb2_grpc.CoordinatorServicer):
    """Raises the error it is given from every method under test."""

    def __init__(self) -> None:
        self.error: ServiceError | None = None

    async def GetDeployment(self, request, context):
        raise self.error

    async def Deploy(self, request, context):
        yield pb.DeployEvent(message="started")
        raise self.error


async def serving(servicer: coordinator_pb2_grpc.CoordinatorServicer,
                  ) -> AsyncIterator[coordinator_pb2_grpc.CoordinatorStub]:
    server, port = coordinator_server(servicer, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield coordinator_pb2_grpc.CoordinatorStub(channel)
    finally:
        await server.stop(0)


@pytest.fixture(scope="module")
async def raising() -> AsyncIterator[tuple[Raising, coordinator_pb2_grpc.CoordinatorStub]]:
    servicer = Raising()
    async for stub in serving(servicer):
        yield servicer, stub


@pytest.fixture
async def coordinator() -> AsyncIterator[coordinator_pb2_grpc.CoordinatorStub]:
    async with DeployRig() as rig:
        servicer = CoordinatorServicer(rig.registry, rig.deployer, LeaseManager(), rig.serve)
        async for stub in serving(servicer):
            yield stub


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
async def test_a_unary_method_carries_every_error_kind(raising, kind):
    servicer, stub = raising
    servicer.error = ERROR_KINDS[kind]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetDeployment(pb.GetDeploymentRequest(), timeout=5)
    assert_carries(e.value, ERROR_KINDS[kind])


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
async def test_a_streaming_method_carries_every_error_kind_after_its_first_message(raising, kind):
    servicer, stub = raising
    servicer.error = ERROR_KINDS[kind]
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async for event in stub.Deploy(pb.DeployRequest(), timeout=5):
            received.append(event.message)
    assert received == ["started"]
    assert_carries(e.value, ERROR_KINDS[kind])


async def refusal(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value


async def deploy_refusal(stub: coordinator_pb2_grpc.CoordinatorStub, request: pb.DeployRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async for _ in stub.Deploy(request, timeout=5):
            pass
    return e.value


async def test_an_unknown_deploy_is_not_found(coordinator):
    err = await refusal(coordinator.GetDeployment(pb.GetDeploymentRequest(deploy_id="nope"), timeout=5))
    assert_carries(err, ServiceError(grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND, "no deploy 'nope'"))
    err = await refusal(coordinator.CancelDeploy(pb.CancelDeployRequest(deploy_id="nope"), timeout=5))
    assert_carries(err, ServiceError(grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND, "no deploy 'nope'"))


async def test_a_deploy_with_duplicate_names_is_refused(coordinator):
    err = await deploy_refusal(coordinator, pb.DeployRequest(models=[spec("a"), spec("a", replicas=2)]))
    assert_carries(err, invalid_parameter("models", "model names must be distinct"))


async def test_an_unspecified_or_vllm_loader_deploys(coordinator):
    vllm = spec("b")
    vllm.loader = common_pb2.LOADER_VLLM
    states = [e.state async for e in coordinator.Deploy(pb.DeployRequest(models=[spec("a"), vllm]), timeout=5)]
    assert states[-1] == pb.DEPLOY_STATE_SUCCEEDED
    listed = await coordinator.ListModels(pb.ListModelsRequest(include_serve_apps=True), timeout=5)
    assert [(m.spec.name, m.ready_replicas) for m in listed.models] == [("a", 1), ("b", 1)]
    assert [a.status for a in listed.apps] == ["RUNNING", "RUNNING"]


@pytest.mark.parametrize(("field", "model"), [
    ("models[0].name", common_pb2.ModelSpec(model="builtin:tiny-qwen2")),
    ("models[0].name", common_pb2.ModelSpec(name="a b", model="builtin:tiny-qwen2")),
    ("models[0].model", common_pb2.ModelSpec(name="a")),
    ("models[0].num_cpus", common_pb2.ModelSpec(name="a", model="m", num_cpus=-2)),
    ("models[0].num_gpus", common_pb2.ModelSpec(name="a", model="m", num_gpus=float("nan"))),
    ("models[0].stall_timeout_s", common_pb2.ModelSpec(name="a", model="m", stall_timeout_s=-1)),
    ("models[0].stall_timeout_s", common_pb2.ModelSpec(name="a", model="m", stall_timeout_s=float("inf"))),
    ("models[0].num_replicas", common_pb2.ModelSpec(name="a", model="m", num_replicas=2, autoscaling=common_pb2.
                                                    AutoscalingConfig(min_replicas=1, max_replicas=2))),
    ("models[0].autoscaling.max_replicas", common_pb2.ModelSpec(name="a", model="m", autoscaling=common_pb2.
                                                                AutoscalingConfig(min_replicas=3, max_replicas=1))),
    ("models[0].autoscaling.upscale_delay_s", common_pb2.ModelSpec(name="a", model="m", autoscaling=common_pb2.
                                                                   AutoscalingConfig(max_replicas=1,
                                                                                     upscale_delay_s=-1))),
])
async def test_a_spec_that_can_never_run_is_refused_naming_its_field(coordinator, field, model):
    err = await deploy_refusal(coordinator, pb.DeployRequest(models=[model]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_carries(err, invalid_parameter(field, err.details()))


async def test_a_negative_drain_timeout_is_refused(coordinator):
    err = await deploy_refusal(coordinator, pb.DeployRequest(models=[spec("a")], drain_timeout_s=-5))
    assert_carries(err, invalid_parameter("drain_timeout_s", "drain_timeout_s must be a number >= 0 (0: no drain)"))


async def test_an_unset_replica_count_is_one_and_deploying_it_again_keeps_it(coordinator):
    unset = common_pb2.ModelSpec(name="z", model="builtin:tiny-qwen2")  # num_replicas left 0, no autoscaling
    for _ in range(2):
        states = [e.state async for e in coordinator.Deploy(pb.DeployRequest(models=[unset]), timeout=5)]
        assert states[-1] == pb.DEPLOY_STATE_SUCCEEDED
    listed = await coordinator.ListModels(pb.ListModelsRequest(), timeout=5)
    assert [(m.spec.num_replicas, m.ready_replicas) for m in listed.models] == [(1, 1)]


@pytest.mark.parametrize("ttl_s", [float("inf"), float("nan"), -1.0, 0.0, 7200.0])
async def test_a_lease_ttl_that_never_or_already_expires_is_refused(coordinator, ttl_s):
    err = await refusal(coordinator.AcquireLease(pb.AcquireLeaseRequest(node_id="n", holder="a", ttl_s=ttl_s),
                                                 timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    lease = await coordinator.AcquireLease(pb.AcquireLeaseRequest(node_id="n", holder="a", ttl_s=30), timeout=5)
    if ttl_s:  # 0 on a renew is the default TTL
        err = await refusal(coordinator.RenewLease(pb.RenewLeaseRequest(lease_id=lease.lease_id, ttl_s=ttl_s),
                                                   timeout=5))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    renewed = await coordinator.RenewLease(pb.RenewLeaseRequest(lease_id=lease.lease_id), timeout=5)
    assert renewed.granted and renewed.expires_at > lease.expires_at - 1


async def test_a_self_heal_deploy_reconciles_whatever_mode_it_names(coordinator):
    request = pb.DeployRequest(use_committed=True, mode=pb.DEPLOY_MODE_ADDITIVE)  # (reconcile is implied)
    states = [e.state async for e in coordinator.Deploy(request, timeout=5)]
    assert states[-1] == pb.DEPLOY_STATE_SUCCEEDED
