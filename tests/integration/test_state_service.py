"""The state service's committed model sets on real Redis: durable across a restart of the
service, password from the environment, and a clean UNAVAILABLE when Redis is down."""

from __future__ import annotations

import grpc
import pytest

from mship.common.v1 import common_pb2
from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.errors import ErrorDetails
from services.state.deployment import start_state_server
from services.state.store import open_store
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
MODELS = [common_pb2.ModelSpec(name="chat", model="builtin:gemma-3-270m", num_replicas=2)]


@pytest.fixture
def redis_server(tmp_path, monkeypatch):
    server = RedisServer(tmp_path, password="s3cret")
    monkeypatch.setenv("MSHIP_REDIS_PASSWORD", "s3cret")
    yield server
    server.stop()


async def _put_then_get(url: str, put: bool) -> pb.ModelSet:
    server, port = await start_state_server(url, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = state_pb2_grpc.StateStub(channel)
            if put:
                await stub.PutModelSet(pb.PutModelSetRequest(model_set=pb.ModelSet(
                    gateway="default", models=MODELS, deploy_id="d1")))
            return await stub.GetModelSet(pb.GetModelSetRequest(gateway="default"))
    finally:
        await server.stop(0)


async def test_committed_set_survives_a_state_service_restart(redis_server):
    first = await _put_then_get(redis_server.url, put=True)
    again = await _put_then_get(redis_server.url, put=False)  # a new server process-state, same Redis
    assert list(again.models) == MODELS and again.deploy_id == "d1" and again.committed_at == first.committed_at


async def test_memory_backend_is_per_process():
    await _put_then_get("memory://", put=True)
    assert list((await _put_then_get("memory://", put=False)).models) == []


async def test_redis_outage_is_a_clean_unavailable(redis_server):
    url = redis_server.url
    redis_server.stop()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _put_then_get(url, put=True)
    details = ErrorDetails.from_rpc_error(info.value)
    assert (details.code, details.reason) == (grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")


def test_password_never_in_the_url():
    with pytest.raises(ValueError, match="MSHIP_REDIS_PASSWORD"):
        open_store("redis://:hunter2@127.0.0.1:6390/0")
    with pytest.raises(ValueError, match="unknown state store"):
        open_store("postgres://x")
