"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from mship.worker.v1 import worker_pb2_grpc
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker


class Served:
    """`await served(engine, **serve_worker's options)`: a stub of a real worker server around the
    engine double; `workers` holds each server started (its servicer, its host)."""

    def __init__(self) -> None:
        self.workers: list[ServedWorker] = []
        self._channels: list[grpc.aio.Channel] = []

    async def __call__(self, engine: ScriptedEngine, **options: Any) -> worker_pb2_grpc.WorkerStub:
        worker = await serve_worker(engine, **options)
        self.workers.append(worker)
        channel = grpc.aio.insecure_channel(worker.address)
        self._channels.append(channel)
        return worker_pb2_grpc.WorkerStub(channel)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        for worker in self.workers:
            await worker.server.stop(0)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    started = Served()
    yield started
    await started.close()
