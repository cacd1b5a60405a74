"""A cluster without Kubernetes, on real parts: `mship start --enable-ray-auth --no-models-on-head`
(a Ray head, Serve, coordinator, state in Redis) and `mship join` of a second Ray node on this
machine (loopback), real vLLM on the joined node. The tests run in order on one cluster: refused
joins, the token on every gRPC service, a model pending until a capable node joins, serving and
cancellation there, then the node's clean leave.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.client import MshipClient, MshipError
from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from mship.state.v1 import state_pb2, state_pb2_grpc
from mship.worker.v1 import worker_pb2 as wpb
from mship.worker.v1 import worker_pb2_grpc
from services.common.channels import aio_channel, sync_channel
from services.common.vocabulary import ENV_NODE_CAPABILITIES, ENV_RAY_AUTH_TOKEN, ENV_REDIS_PASSWORD
from tests.helpers import stream_then_drop, until_sync
from tests.node_process import JoinProcess
from tests.platform_process import PlatformProcess, mship
from tests.redis_server import RedisServer
from tests.worker_calls import wait_load

pytestmark = pytest.mark.integration
TOKEN = secrets.token_hex(16)
DRAIN_S = 20.0
MODEL = ("--model", "builtin:tiny-qwen2", "--name", "tiny", "--max-model-len", "1024", "--num-cpus", "0.5")


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_RAY_AUTH_TOKEN}
    return {**env, ENV_RAY_AUTH_TOKEN: token} if token else env


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformProcess]:
    home = Path(tmp_path_factory.mktemp("cluster"))
    redis = RedisServer(home, password="redis-secret")
    env = {**_env(TOKEN), ENV_REDIS_PASSWORD: "redis-secret"}  # the password never sits in the URL
    proc = PlatformProcess.start(None, home / "head.log", gateway_replicas=1, state_store=redis.url, env=env,
                                 extra=("--enable-ray-auth", "--no-models-on-head"))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
        redis.stop()


@pytest.fixture(scope="module")
def joiner(head: PlatformProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JoinProcess]:
    """A second node, joined with the right token (first requested after the pending test)."""
    log = Path(tmp_path_factory.mktemp("joiner")) / "join.log"
    # vLLM only (the override): a llama_cpp model then has no node that can host it
    env = {**_env(TOKEN), ENV_NODE_CAPABILITIES: '["vllm"]'}
    proc = JoinProcess.start(head.gcs_address, log, name="worker-node", env=env,
                             extra=("--node-num-cpus", "4", "--drain-timeout", str(DRAIN_S)))
    try:
        proc.wait_joined()
        yield proc
    finally:
        proc.stop()


def status(head: PlatformProcess, token: str | None = TOKEN) -> dict:
    out = mship("status", "--coordinator", head.coordinator, "--json", env=_env(token), timeout_s=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def alive_nodes(head: PlatformProcess) -> list[dict]:
    return [n for n in status(head)["nodes"] if n["alive"]]


def test_join_with_a_wrong_or_no_token_is_refused_within_60s(head, tmp_path):
    t0 = time.monotonic()
    joins = [JoinProcess.start(head.gcs_address, tmp_path / f"{name}.log", name=name, env=_env(token))
             for name, token in (("wrong", "not-the-token"), ("none", None))]
    for join in joins:
        join.proc.wait(60)
    assert time.monotonic() - t0 < 60
    for join in joins:
        assert join.proc.returncode == 6, join.tail()
        assert ENV_RAY_AUTH_TOKEN in join.tail() and "Traceback" not in join.tail()
    assert len(alive_nodes(head)) == 1


def test_every_platform_service_requires_the_token_but_health_stays_open(head):
    for address, call in ((head.coordinator, lambda ch: coordinator_pb2_grpc.CoordinatorStub(ch).ListModels(
            cpb.ListModelsRequest(), timeout=10)),
            (f"127.0.0.1:{head.state_port}", lambda ch: state_pb2_grpc.StateStub(ch).GetModelSet(
                state_pb2.GetModelSetRequest(), timeout=10))):
        for token in (None, "wrong"):
            with (grpc.insecure_channel(address) if token is None else sync_channel(address, token=token)) as ch:
                with pytest.raises(grpc.RpcError) as refused:
                    call(ch)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert ENV_RAY_AUTH_TOKEN in refused.value.details()
                probe = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert probe.status == health_pb2.HealthCheckResponse.SERVING
        with sync_channel(address, token=TOKEN) as ch:
            call(ch)
    out = mship("status", "--coordinator", head.coordinator, env=_env(None))
    assert out.returncode == 6 and ENV_RAY_AUTH_TOKEN in out.stderr


def test_a_model_no_node_can_host_stays_pending_naming_the_resource(head, tmp_path):
    out = mship("deploy", "--coordinator", head.coordinator, *MODEL, "--wait", env=_env(None))
    assert out.returncode == 6 and ENV_RAY_AUTH_TOKEN in out.stderr  # a remote deploy without the token
    env_file = tmp_path / "cluster.env"
    env_file.write_text(f"{ENV_RAY_AUTH_TOKEN}={TOKEN}\n")
    env_file.chmod(0o600)
    out = mship("deploy", "--coordinator", head.coordinator, "--env-file", str(env_file), *MODEL, "--wait",
                env=_env(None))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pending" in out.stdout and "mship_vllm" in out.stdout
    (pending,) = status(head)["pending"]
    assert pending["name"] == "tiny" and "mship_vllm" in pending["reason"]


def test_the_joined_node_hosts_the_model_and_serves_it_through_the_head(head, joiner):
    nodes = alive_nodes(head)
    assert sorted((n["name"], n["is_head"], n["capabilities"]) for n in nodes if n["name"] == "worker-node") == [
        ("worker-node", False, ["vllm"])]
    assert len(nodes) == 2 and [n["capabilities"] for n in nodes if n["is_head"]] == [[]]
    until_sync(lambda: any(r["state"] == "ready" for m in status(head)["models"] for r in m["replicas"]),
               "the pending model started on the joined node", timeout_s=600, poll_s=2)
    report = status(head)
    (joined,) = [n["node_id"] for n in report["nodes"] if n["name"] == "worker-node" and n["alive"]]
    (model,) = report["models"]
    assert [r["node_id"] for r in model["replicas"]] == [joined] and report["pending"] == []
    assert all(not r["endpoint"].startswith("0.0.0.0") for r in model["replicas"])
    reply = httpx.post(f"{head.base_url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    # Each node's metrics port serves its own processes: the worker's series only on the joined node
    # (the only one that runs vLLM), the coordinator's on the head; the head's file_sd file lists both.
    joined_text = httpx.get(f"http://127.0.0.1:{joiner.metrics_port}/metrics", timeout=10).text
    head_text = httpx.get(f"http://127.0.0.1:{head.metrics_port}/metrics", timeout=10).text
    assert 'mship_worker_requests_total{model="tiny",outcome="finished"}' in joined_text
    assert "mship_worker_requests_total{" not in head_text and "mship_coordinator_routing_version" in head_text
    until_sync(lambda: sorted(json.loads(head.sd_file().read_text())[0]["targets"]) == sorted(
        f"127.0.0.1:{p}" for p in (head.metrics_port, joiner.metrics_port)), "both nodes in the file_sd file",
        timeout_s=30)


def test_a_loader_no_node_advertises_waits_while_the_other_models_serve(head, joiner):
    config = ("models:\n  - {name: tiny, model: builtin:tiny-qwen2, max_model_len: 1024, num_cpus: 0.5}\n"
              "  - {name: smol, model: builtin:smollm2-135m-instruct, loader: llama_cpp}\n")
    path = joiner.log_path.parent / "both.yaml"
    path.write_text(config)
    out = mship("deploy", "--coordinator", head.coordinator, "--config", str(path), "--wait", env=_env(TOKEN))
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"tiny\s+unchanged", out.stdout) and "mship_llama_cpp" in out.stdout
    report = status(head)
    assert [(p["name"], "mship_llama_cpp" in p["reason"]) for p in report["pending"]] == [("smol", True)]
    reply = httpx.post(f"{head.base_url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
    assert reply.status_code == 200


async def test_python_client_needs_the_token(head):
    async with MshipClient(head.coordinator, token=TOKEN) as client:
        assert (await client.chat("tiny", [{"role": "user", "content": "hello"}], max_tokens=4)).text
    with pytest.raises(MshipError) as refused:
        async with MshipClient(head.coordinator, token="wrong", ready_timeout_s=3):
            pass
    assert refused.value.details.code == grpc.StatusCode.UNAUTHENTICATED


async def test_streaming_cancellation_stops_the_engine_on_the_joined_node(head):
    (route,) = [m for m in head.routing().models if m.name == "tiny"]
    endpoint = route.replicas[0].endpoint
    async with aio_channel(f"{endpoint.host}:{endpoint.port}", token=TOKEN) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        await asyncio.to_thread(stream_then_drop, head.http_port, 5)
        report, _ = await wait_load(stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0, 2.0)
        frozen = report.generated_tokens_total
        await asyncio.sleep(0.3)
        assert (await stub.GetLoad(wpb.GetLoadRequest())).generated_tokens_total == frozen


def test_sigterm_on_the_joined_node_leaves_cleanly_and_the_head_keeps_serving(head, joiner):
    took = joiner.stop(timeout_s=DRAIN_S + 30)
    assert joiner.proc.returncode == 0 and took < DRAIN_S + 15, joiner.tail()
    assert "left the cluster" in joiner.tail()
    assert httpx.get(f"{head.base_url}/health", timeout=10).status_code == 200
    until_sync(lambda: [n["is_head"] for n in alive_nodes(head)] == [True], "the node gone from the status",
               timeout_s=30)
    until_sync(lambda: len(status(head)["pending"]) == 2, "the model pending again", timeout_s=30)
    reasons = {p["name"]: p["reason"] for p in status(head)["pending"]}
    assert "mship_vllm" in reasons["tiny"] and "mship_llama_cpp" in reasons["smol"]


def test_a_taken_port_fails_start_at_once_naming_the_flag(head, tmp_path):
    t0 = time.monotonic()
    out = mship("start", "--http-port", str(head.http_port), timeout_s=60)
    assert out.returncode == 5 and "--http-port" in out.stderr and str(head.http_port) in out.stderr
    out = mship("start", "--http-port", "0", "--gcs-port", str(head.gcs_port), timeout_s=60)
    assert out.returncode == 5 and "--gcs-port" in out.stderr
    assert time.monotonic() - t0 < 30


def test_mship_stop_ends_only_its_own_platform(head, platform):
    """Two platforms on this machine (this cluster's head and the session's): stopping one by its
    coordinator leaves the other serving."""
    out = mship("stop", "--coordinator", head.coordinator, timeout_s=120)
    assert out.returncode == 0, out.stderr  # (its models wait for a node: Serve's stop of those takes 30 s)
    assert head.proc.wait(30) == 0
    assert httpx.get(f"{platform.base_url}/readyz", timeout=10).status_code == 200
    reply = httpx.post(f"{platform.base_url}/v1/chat/completions", timeout=60, headers=platform.headers, json={
        "model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
    assert reply.status_code == 200, reply.text
