"""A gRPC server built by a service's own construction, started on a free loopback port for one test,
and the failures of calls to it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from typing import Any, TypeVar

import grpc
import pytest

T = TypeVar("T")


@contextlib.asynccontextmanager
async def serving(server: grpc.aio.Server) -> AsyncIterator[grpc.aio.Channel]:
    """Bind and start `server`, open a channel to it; close the channel and stop the server after."""
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(0)


@contextlib.asynccontextmanager
async def routing_coordinator(keepalive_s: float = 0.1) -> AsyncIterator[tuple[Any, grpc.aio.Server, int]]:
    """A real coordinator servicer that serves routing only (no deployer, no Serve), its routes
    ready, on a free loopback port: (its replica registry, the server, the port)."""
    from mship.coordinator.v1 import coordinator_pb2_grpc
    from services.coordinator.registry import ReplicaRegistry
    from services.coordinator.servicer import CoordinatorServicer

    registry = ReplicaRegistry()
    servicer = CoordinatorServicer(registry, None, None, None, keepalive_s=keepalive_s)  # type: ignore[arg-type]
    servicer.routing_ready.set()
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield registry, server, port
    finally:
        await server.stop(0)


async def failure_of(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error a unary call ended with (it must fail)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def stream_failure_of(call: AsyncIterable[T]) -> tuple[list[T], grpc.aio.AioRpcError]:
    """What a streaming call sent before it failed, and the error it ended with (it must fail)."""
    sent: list[T] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for message in call:
            sent.append(message)
    return sent, info.value
