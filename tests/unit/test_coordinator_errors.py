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
