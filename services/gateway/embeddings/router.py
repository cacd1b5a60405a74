"""`POST /v1/embeddings`."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.edge.answer import post_router
from services.gateway.embeddings.serving import EmbeddingServing


def embeddings_router(serving: EmbeddingServing) -> APIRouter:
    return post_router("/v1/embeddings", serving.create)
