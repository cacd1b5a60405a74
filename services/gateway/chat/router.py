"""`POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.chat.serving import ChatServing
from services.gateway.edge.answer import post_router


def chat_router(serving: ChatServing) -> APIRouter:
    return post_router("/v1/chat/completions", serving.create)
