"""Server interceptors shared by every mship gRPC service (worker, coordinator, state).

`ErrorInterceptor` is the one place where a raised `ServiceError` becomes the call's rich status
(code + google.rpc details): servicers only raise. `TokenAuthInterceptor` runs before it and
refuses through the same mechanism. `RequestIdInterceptor` gives the handler the caller's
`x-request-id` (for its log lines).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from services.common.auth import HEALTH_PREFIX, UNAUTHENTICATED_MESSAGE, platform_token
from services.common.errors import Reason, ServiceError
from services.common.logs import REQUEST_ID_METADATA, clean_request_id, request_id
from services.common.tracing import server_interceptors as tracing_interceptors

log = logging.getLogger(__name__)


def _unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request_or_iterator, context)
        except ServiceError as e:
            await context.abort_with_status(e.to_status())
    return wrapper


def _streaming(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for message in behavior(request_or_iterator, context):
                yield message
        except ServiceError as e:
            await context.abort_with_status(e.to_status())
    return wrapper


# (handler attribute, its handler factory, the wrapper for its behavior)
_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler, _unary),
          ("unary_stream", grpc.unary_stream_rpc_method_handler, _streaming),
          ("stream_unary", grpc.stream_unary_rpc_method_handler, _unary),
          ("stream_stream", grpc.stream_stream_rpc_method_handler, _streaming))


def _rebuilt(handler: grpc.RpcMethodHandler | None,
             behavior_for: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
             ) -> grpc.RpcMethodHandler | None:
    """`handler` of the same kind with the behavior `behavior_for(behavior, wrap)` returns."""
    for attr, make_handler, wrap in _KINDS if handler is not None else ():
        behavior = getattr(handler, attr)
        if behavior is not None:
            return make_handler(behavior_for(behavior, wrap), handler.request_deserializer,
                                handler.response_serializer)
    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Turns `ServiceError` raised by any handler (unary or streaming) into its gRPC status."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return _rebuilt(await continuation(details), lambda behavior, wrap: wrap(behavior))


_REFUSED = ServiceError(grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


async def _refuse(_request: Any, _context: grpc.aio.ServicerContext) -> Any:
    raise _REFUSED


async def _refuse_stream(_request: Any, _context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    raise _REFUSED
    yield  # an async generator, as a streaming method's behavior is


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED (a rich status, like every refusal) to a call without
    `authorization: Bearer <token>`, compared in constant time; grpc.health.v1 stays open."""

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
        if details.method.startswith(HEALTH_PREFIX) or self.authorized(details.invocation_metadata):
            return handler
        return _rebuilt(handler, lambda _, wrap: wrap(_refuse_stream if wrap is _streaming else _refuse))


def _request_id_of(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_METADATA:
            return clean_request_id(value)
    return ""


def _with_request_id(behavior: Callable[..., Any], wrap: Callable[..., Any]) -> Callable[..., Any]:
    if wrap is _streaming:
        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            request_id.set(_request_id_of(context))  # this handler's own context: nothing to reset
            async for message in behavior(request, context):
                yield message
        return streaming

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        request_id.set(_request_id_of(context))
        return await behavior(request, context)
    return unary


class RequestIdInterceptor(grpc.aio.ServerInterceptor):
    """The caller's `x-request-id` metadata becomes the handler's request id (its log lines)."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return _rebuilt(await continuation(details), _with_request_id)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The interceptors every mship gRPC server is built with, outermost first: the call's span
    (when this process traces: services/common/tracing.py), then the token check (when the cluster
    has one) refuses before anything else runs."""
    token = platform_token()
    return [*tracing_interceptors(), *([TokenAuthInterceptor(token)] if token else []), RequestIdInterceptor(),
            ErrorInterceptor()]


def platform_server(add_servicer: Callable[[Any, grpc.aio.Server], None], servicer: Any,
                    options: Sequence[tuple[str, Any]] = (),
                    health_servicer: health.aio.HealthServicer | None = None,
                    outer: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    """A grpc.aio server (not bound, not started) with the platform's interceptors, `servicer`
    (registered by its generated `add_*Servicer_to_server`) and, given one, grpc.health.v1: every
    mship service builds its server here, so a new interceptor reaches all of them at once. `outer`:
    a service's own interceptors (its metrics), outside the platform's."""
    server = grpc.aio.server(interceptors=[*outer, *server_interceptors()], options=list(options))
    add_servicer(servicer, server)
    if health_servicer is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    return server
