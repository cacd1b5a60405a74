"""ModelHost's load lifecycle and its progress log (an EventLog), with the engine double standing in
for vLLM: every caller sees the whole history, from the start, through READY or FAILED."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from grpc_health.v1 import health_pb2

from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from services.worker import host as host_module
from services.worker.host import ModelHost
from tests.engine_double import ScriptedEngine

SPEC = common_pb2.ModelSpec(name="m", model="scripted")
PHASES = ["LOAD_PHASE_RESOLVING", "LOAD_PHASE_LOADING", "LOAD_PHASE_WARMING"]


SERVING = health_pb2.HealthCheckResponse.SERVING


class RecordedHealth:
    def __init__(self) -> None:
        self.statuses: list[int] = []

    async def set(self, service: str, status: int) -> None:
        self.statuses.append(status)


async def phases(host: ModelHost) -> list[str]:
    return [pb.LoadPhase.Name(e.phase) async for e in host.progress()]


async def test_a_load_reports_every_phase_to_early_and_late_callers(monkeypatch: pytest.MonkeyPatch):
    engine = ScriptedEngine(["x"])
    monkeypatch.setattr(host_module, "resolve_model", lambda ref: f"/models/{ref}")

    async def start(spec, path):
        return engine
    monkeypatch.setattr(host_module, "start_engine", start)
    health = RecordedHealth()
    host = ModelHost(health)  # type: ignore[arg-type]
    frozen: list[tuple[str, int]] = []  # the start-up heap is frozen once warm, before health says SERVING
    monkeypatch.setattr(host_module, "freeze_startup_heap",
                        lambda what: frozen.append((what, len(health.statuses))) or 0)
    host.begin_load(SPEC)
    assert await phases(host) == [*PHASES, "LOAD_PHASE_READY"]  # followed while it loads
    await host.wait_ready()
    assert host.ready and engine.started == ["warmup", "warmup-a", "warmup-b"] and host.load_seconds() >= 0
    assert frozen == [("worker m", 0)] and health.statuses == [SERVING, SERVING]
    assert await phases(host) == [*PHASES, "LOAD_PHASE_READY"]  # a late caller: the whole history
    await host.shutdown()


async def test_a_failed_load_ends_progress_and_wait_ready(monkeypatch: pytest.MonkeyPatch):
    def missing(ref: str) -> str:
        raise FileNotFoundError("model path /nope does not exist on this node")
    monkeypatch.setattr(host_module, "resolve_model", missing)
    host = ModelHost()
    host.begin_load(SPEC)
    with pytest.raises(RuntimeError, match="FileNotFoundError: model path /nope"):
        await host.wait_ready()
    assert await phases(host) == ["LOAD_PHASE_RESOLVING", "LOAD_PHASE_FAILED"]
    assert not host.ready and host.load_seconds() == 0.0


async def test_a_shutdown_during_the_load_returns_once_the_load_cleaned_up(monkeypatch: pytest.MonkeyPatch):
    """Serve stopping a replica mid-load: what the load holds (an engine process half started, the
    node's load lease) is let go before shutdown returns, not left to a task the process outlives."""
    monkeypatch.setattr(host_module, "resolve_model", lambda ref: ref)
    loading, released = asyncio.Event(), []

    async def start(spec, path):
        loading.set()
        try:
            await asyncio.Event().wait()  # a load that takes minutes
        finally:
            await asyncio.sleep(0)  # stopping the engine's process takes a moment
            released.append("engine")
    monkeypatch.setattr(host_module, "start_engine", start)

    @contextlib.asynccontextmanager
    async def lease() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.sleep(0)  # ReleaseLease is a call to the coordinator
            released.append("lease")

    host = ModelHost()
    host.begin_load(SPEC, lease)
    await loading.wait()
    await host.shutdown()
    assert released == ["engine", "lease"]
