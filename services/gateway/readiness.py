"""`/health` (the process answers) and `/readyz` (routes received, every model asked for served by a
healthy replica; per model its state and load time; `?scope=gateway`: routes received, answered
without asking the coordinator, so without load times).

Model states: `loaded` (healthy replicas take traffic), `scaled_to_zero` (autoscaled to no replica:
a request starts one), `pending` (asked for, not serving yet) and `unhealthy` (every replica's
engine fails its health check; Serve is replacing them)."""

from __future__ import annotations

import grpc
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.channels import aio_channel
from services.common.routes import RouteTable
from services.gateway.protocol_common.openai_error import OpenAIError


def readiness_router(table: RouteTable, coordinator: str) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz(scope: str = "models") -> Response:
        """`?scope=gateway`: 200 as soon as this gateway routes (a Kubernetes readiness probe: one
        model's trouble must not take every gateway out of the Service); default: the models too."""
        if scope not in ("models", "gateway"):  # the edge's one error path makes the OpenAI error object
            raise OpenAIError(400, "'scope' must be 'models' or 'gateway'.", param="scope")
        pending, unhealthy = sorted(table.pending), sorted(table.unhealthy)
        idle = sorted(name for name, route in table.routes.items() if route.scale_to_zero and not route.endpoints)
        loaded = sorted(set(table.routes) - set(idle))
        ready = table.received.is_set() and (scope == "gateway" or not (pending or unhealthy))
        # The gateway's own probe never waits on the coordinator: one that hangs (its node lost) must
        # not time out every gateway's probe while they route on their last snapshot.
        load_times = {} if scope == "gateway" else await _load_times(coordinator)
        states = {**{n: "loaded" for n in loaded}, **{n: "scaled_to_zero" for n in idle},
                  **{n: "pending" for n in pending}, **{n: "unhealthy" for n in unhealthy}}
        models = {name: {"state": state, "replicas": len(table.routes[name].endpoints) if name in table.routes else 0,
                         **({"load_time_s": load_times[name]} if name in load_times else {})}
                  for name, state in sorted(states.items())}
        body = {"ready": ready, "loaded": loaded, "pending": pending, "unhealthy": unhealthy,
                "scaled_to_zero": idle, "models": models, "routing_version": table.version,
                "load_times_s": load_times}
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
