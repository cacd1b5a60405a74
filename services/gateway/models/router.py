"""`GET /v1/models` and `GET /v1/models/{id}` (ids may hold slashes: `org/model`)."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.models.serving import ModelsServing


def models_router(serving: ModelsServing) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> dict:
        return serving.list()

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict:
        return serving.get(model_id)

    return router
