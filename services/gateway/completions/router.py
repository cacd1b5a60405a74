"""`POST /v1/completions`."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.completions.serving import CompletionServing


def completions_router(serving: CompletionServing) -> APIRouter:
    router = APIRouter()
    router.add_api_route("/v1/completions", serving.create, methods=["POST"])
    return router
