"""What the llama_cpp worker tests share: a worker gRPC server in this process over one ModelSpec,
a stub to it, its engine, and llama.cpp's own view of which slots are generating (`/slots`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import httpx

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2_grpc
from services.worker.llama_cpp_engine import LlamaCppEngine
from services.worker.server import WorkerServer, start_worker_server


@contextlib.asynccontextmanager
async def running_worker(spec: common_pb2.ModelSpec) -> AsyncIterator[WorkerServer]:
    server = await start_worker_server(spec, "127.0.0.1", 0)
    try:
        await server.host.wait_ready()
        yield server
    finally:
        await server.stop(grace_s=1)


@contextlib.asynccontextmanager
async def stub_of(worker: WorkerServer) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


def engine(worker: WorkerServer) -> LlamaCppEngine:
    assert isinstance(worker.host.engine, LlamaCppEngine)
    return worker.host.engine


async def processing_slots(worker: WorkerServer) -> list[int]:
    """Ids of the slots generating now, as llama.cpp itself reports them."""
    async with httpx.AsyncClient(base_url=engine(worker).server_url) as client:
        return [s["id"] for s in (await client.get("/slots", timeout=5)).json() if s["is_processing"]]
