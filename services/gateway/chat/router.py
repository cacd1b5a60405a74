"""`POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.chat.serving import ChatServing


def chat_router(serving: ChatServing) -> APIRouter:
    router = APIRouter()
    router.add_api_route("/v1/chat/completions", serving.create, methods=["POST"])
    return router
