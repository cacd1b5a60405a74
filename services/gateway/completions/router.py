"""`POST /v1/completions`."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.completions.serving import CompletionServing
from services.gateway.edge.answer import post_router


def completions_router(serving: CompletionServing) -> APIRouter:
    return post_router("/v1/completions", serving.create)
