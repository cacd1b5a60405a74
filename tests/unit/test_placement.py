"""Capability-aware placement in the deployer and the coordinator's ClusterStatus (fake Serve): a
model no node can host is deployed and pending, named with the missing resource, and starts when a
capable node joins; a new version no node can host is refused while the old one serves on."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.fingerprint import version_of
from services.coordinator.leases import LeaseManager
from services.coordinator.serve_control import NodeState
from services.coordinator.servicer import CoordinatorServicer
from tests.helpers import until
from tests.serve_control_fake import DeployRig, phases
from tests.serve_control_fake import model_spec as spec

Phase = pb.ModelPhase
HEAD_ONLY = NodeState("node-head", "head", "127.0.0.1", True, True, {"CPU": 4.0, "node:__internal_head__": 1.0})
VLLM_NODE = NodeState("node-2", "gpu-box", "10.0.0.2", True, False, {"CPU": 8.0, "mship_vllm": 1000.0})


@pytest.fixture
async def rig() -> AsyncIterator[DeployRig]:
    async with DeployRig() as rig:
        rig.serve.node_list = [HEAD_ONLY]  # --no-models-on-head, nothing joined yet
        yield rig


def cluster_status(rig: DeployRig):
    servicer = CoordinatorServicer(rig.registry, rig.deployer, LeaseManager(), rig.serve)
    return servicer.ClusterStatus(pb.ClusterStatusRequest(), None)


async def test_a_model_no_node_can_host_is_pending_and_the_deploy_succeeds(rig):
    record = await rig.deploy(spec("a"))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED
    assert phases(record) == {"a": Phase.MODEL_PHASE_PENDING}
    assert "mship_vllm" in record.models["a"].reason
    assert rig.route("a") == version_of(spec("a")) and rig.commits == [[spec("a")]]  # deployed and committed
    status = await cluster_status(rig)
    assert [(p.name, "mship_vllm" in p.reason) for p in status.pending] == [("a", True)]
    assert [(n.name, list(n.capabilities), n.is_head) for n in status.nodes] == [("head", [], True)]


async def test_the_pending_model_starts_when_a_capable_node_joins(rig):
    await rig.deploy(spec("a"))
    await rig.serve.join(VLLM_NODE)
    await until(lambda: rig.registry.live("a", version_of(spec("a"))), "the replica registered")
    status = await cluster_status(rig)
    assert status.pending == [] and [len(m.replicas) for m in status.models] == [1]
    assert status.models[0].replicas[0].state == "ready"
    assert sorted(list(n.capabilities) for n in status.nodes) == [[], ["vllm"]]


async def test_a_new_version_no_node_can_host_is_refused_and_the_old_one_serves(rig):
    rig.serve.node_list = [VLLM_NODE]
    await rig.deploy(spec("a"))
    rig.serve.node_list = [HEAD_ONLY, dataclasses.replace(VLLM_NODE, alive=False)]  # a dead node's do not count
    record = await rig.deploy(spec("a", 768))
    assert record.state == pb.DEPLOY_STATE_FAILED
    assert record.models["a"].phase == Phase.MODEL_PHASE_FAILED and "mship_vllm" in record.models["a"].reason
    assert rig.route("a") == version_of(spec("a"))


async def test_only_the_unhostable_model_waits_the_others_serve(rig):
    rig.serve.node_list = [HEAD_ONLY, VLLM_NODE]
    llama = spec("b")
    llama.loader = common_pb2.LOADER_LLAMA_CPP  # no node advertises mship_llama_cpp
    record = await rig.deploy(spec("a"), llama)
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED
    assert phases(record) == {"a": Phase.MODEL_PHASE_READY, "b": Phase.MODEL_PHASE_PENDING}
    assert "mship_llama_cpp" in record.models["b"].reason


async def test_a_model_asking_for_more_cpus_or_gpus_than_any_node_has_is_pending_naming_them(rig):
    rig.serve.node_list = [HEAD_ONLY, VLLM_NODE]  # 8 CPUs, no GPU
    gpu, big = spec("gpu"), spec("big")
    gpu.num_gpus, big.num_cpus = 1, 64
    record = await rig.deploy(gpu, big, spec("small"))
    assert record.state == pb.DEPLOY_STATE_SUCCEEDED
    assert phases(record) == {"gpu": Phase.MODEL_PHASE_PENDING, "big": Phase.MODEL_PHASE_PENDING,
                              "small": Phase.MODEL_PHASE_READY}
    assert "1 GPUs" in record.models["gpu"].reason and "64 CPUs" in record.models["big"].reason
    await rig.serve.join(dataclasses.replace(VLLM_NODE, node_id="node-3", resources={
        "CPU": 64.0, "GPU": 1.0, "mship_vllm": 1000.0}))
    await until(lambda: rig.registry.live("gpu", version_of(gpu)) and rig.registry.live("big", version_of(big)),
                "both start on the node that has them")
