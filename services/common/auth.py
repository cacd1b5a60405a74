"""The platform token on gRPC: servers require it, every client of the platform sends it.

With `MSHIP_RAY_AUTH_TOKEN` set (the cluster token, the same one Ray checks), every mship server
refuses a call without `authorization: Bearer <token>` as UNAUTHENTICATED, except grpc.health.v1
(probes carry no secrets). Unset, nothing is checked or sent: a single-node platform on loopback.
The check is one server interceptor and the sending one client interceptor per channel
(services/common/channels.py), never code in a method.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common.vocabulary import ENV_RAY_AUTH_TOKEN

HEALTH_PREFIX = "/grpc.health.v1.Health/"
UNAUTHENTICATED_MESSAGE = (f"missing or wrong platform token: send `authorization: Bearer <token>` with the "
                           f"cluster's {ENV_RAY_AUTH_TOKEN}")


def platform_token() -> str | None:
    """The cluster token of this process's node, or None when auth is off."""
    return os.environ.get(ENV_RAY_AUTH_TOKEN) or None


def bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


def _refusal(kind: str) -> Callable[..., Any]:
    if kind in ("unary_stream", "stream_stream"):
        async def refuse_stream(_request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            yield  # an async generator, as the method's kind requires
        return refuse_stream

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
    return refuse


_HANDLER_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
                  ("unary_stream", grpc.unary_stream_rpc_method_handler),
                  ("stream_unary", grpc.stream_unary_rpc_method_handler),
                  ("stream_stream", grpc.stream_stream_rpc_method_handler))


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to a call without the token (constant-time comparison)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def authorized(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX) or self.authorized(
                details.invocation_metadata):
            return handler
        for kind, make_handler in _HANDLER_KINDS:  # a refusal of the method's own kind
            if getattr(handler, kind) is not None:
                return make_handler(_refusal(kind), handler.request_deserializer, handler.response_serializer)
        return handler
