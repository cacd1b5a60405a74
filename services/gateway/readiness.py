"""`/health` (the process answers) and `/readyz` (routes received, nothing pending, per-model load
times from the coordinator)."""

from __future__ import annotations

import grpc
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.channels import aio_channel
from services.common.routes import RouteTable


def readiness_router(table: RouteTable, coordinator: str) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> Response:
        loaded, pending = sorted(table.routes), sorted(table.pending)
        ready = table.received.is_set() and not pending
        body = {"ready": ready, "loaded": loaded, "pending": pending, "routing_version": table.version,
                "load_times_s": await _load_times(coordinator)}
        return JSONResponse(body, status_code=200 if ready else 503)

    return router


async def _load_times(coordinator: str) -> dict[str, float]:
    """Per-model load times from the coordinator (readiness detail; absent if it is unreachable)."""
    try:
        async with aio_channel(coordinator) as channel:
            reply = await coordinator_pb2_grpc.CoordinatorStub(channel).ListModels(cpb.ListModelsRequest(), timeout=1)
    except grpc.aio.AioRpcError:
        return {}
    return {m.spec.name: round(m.load_time_s, 2) for m in reply.models}
