"""The platform token on real grpc.aio servers: the state service built with MSHIP_RAY_AUTH_TOKEN
refuses calls without it (unary and streaming) as UNAUTHENTICATED, keeps grpc.health.v1 open, and
the platform's channels (aio and blocking) carry it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mship.state.v1 import state_pb2 as pb
from mship.state.v1 import state_pb2_grpc
from services.common.channels import aio_channel, sync_channel
from services.common.errors import ErrorDetails
from services.common.interceptors import TokenAuthInterceptor
from services.common.vocabulary import ENV_RAY_AUTH_TOKEN
from services.state.server import start_state_server

TOKEN = "s3cret-token"


@pytest.fixture
async def address(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    monkeypatch.setenv(ENV_RAY_AUTH_TOKEN, TOKEN)  # read when the server is built
    server, port = await start_state_server("memory://", "127.0.0.1", 0)
    monkeypatch.delenv(ENV_RAY_AUTH_TOKEN)  # clients below send only what they are given
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def _unary(stub: state_pb2_grpc.StateStub):
    return stub.GetModelSet(pb.GetModelSetRequest(), timeout=5)


async def _streamed(stub: state_pb2_grpc.StateStub) -> list:
    request = pb.ReadEventsRequest(key=pb.ResponseKey(identity="i", response_id="r"))
    return [e async for e in stub.ReadEvents(request, timeout=5)]


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", ""])
async def test_calls_without_the_right_token_are_unauthenticated(address, token):
    async with (grpc.aio.insecure_channel(address) if token is None else aio_channel(address, token=token)) as ch:
        stub = state_pb2_grpc.StateStub(ch)
        for call in (_unary(stub), _streamed(stub)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert ENV_RAY_AUTH_TOKEN in refused.value.details()
            assert ErrorDetails.from_rpc_error(refused.value).reason == "UNAUTHENTICATED"  # a rich status


async def test_health_stays_open_without_a_token(address):
    async with grpc.aio.insecure_channel(address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def _passes_the_check(call) -> None:
    """The call reaches the service: answered, or refused for another reason than the token."""
    try:
        await call
    except grpc.aio.AioRpcError as e:
        assert e.code() != grpc.StatusCode.UNAUTHENTICATED, e.details()


async def test_the_platform_channels_carry_the_token(address, monkeypatch):
    async with aio_channel(address, token=TOKEN) as ch:  # every call kind (grpc.aio files each separately)
        stub = state_pb2_grpc.StateStub(ch)
        await _unary(stub)
        await _passes_the_check(_streamed(stub))
    monkeypatch.setenv(ENV_RAY_AUTH_TOKEN, TOKEN)  # by default, this node's token
    async with aio_channel(address) as ch:
        await _unary(state_pb2_grpc.StateStub(ch))

    def blocking() -> None:  # in a thread: the server runs on this loop
        with sync_channel(address) as ch:
            stub = state_pb2_grpc.StateStub(ch)
            stub.GetModelSet(pb.GetModelSetRequest(), timeout=5)
            try:
                list(stub.ReadEvents(pb.ReadEventsRequest(key=pb.ResponseKey(identity="i", response_id="r")),
                                     timeout=5))
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.UNAUTHENTICATED, e.details()

    await asyncio.to_thread(blocking)


def test_the_comparison_needs_the_whole_bearer_value():
    check = TokenAuthInterceptor(TOKEN)
    assert check.authorized([("authorization", f"Bearer {TOKEN}")])
    assert not check.authorized([("authorization", TOKEN)])
    assert not check.authorized([("authorization", f"Bearer {TOKEN[:-1]}")])
    assert not check.authorized([("x-other", f"Bearer {TOKEN}")])
    assert not check.authorized(None)
