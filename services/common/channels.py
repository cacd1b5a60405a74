"""Every gRPC channel to a platform service opens here, so each carries the platform token.

With no token configured (auth off) and tracing off a channel is a plain insecure one: no
interceptor on the hot path. With a token, a client interceptor adds `authorization: Bearer <token>`
to every call (the gateway's and the Python client's Infer streams included); when the process
traces (services/common/tracing.py), the span interceptors come first and add `traceparent`.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import grpc

from services.common.auth import bearer, platform_token
from services.common.tracing import aio_client_interceptors, traced_sync_channel

Options = Sequence[tuple[str, Any]]


def aio_channel(address: str, options: Options = (), token: str | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` sending `token` (default: this node's platform token)."""
    token = token or platform_token()
    interceptors = [*aio_client_interceptors(), *(aio_bearer_interceptors(token) if token else ())]
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors or None)


def sync_channel(address: str, options: Options = (), token: str | None = None) -> grpc.Channel:
    """A blocking channel (the CLI's) to `address` sending `token` (default: the platform token)."""
    token = token or platform_token()
    channel = traced_sync_channel(grpc.insecure_channel(address, options=list(options)))
    return grpc.intercept_channel(channel, SyncBearerInterceptor(token)) if token else channel


class _AioBearer:
    def __init__(self, token: str) -> None:
        self._header = bearer(token)

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        # A Metadata object, as the channel built it: the streaming calls take nothing else.
        metadata = grpc.aio.Metadata.from_tuple((*tuple(d.metadata or ()), self._header))
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


# One class per call kind: grpc.aio files an interceptor under the first kind it implements only.
class _AioUnaryUnary(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioUnaryStream(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioStreamUnary(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _AioStreamStream(_AioBearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def aio_bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors adding the token to every call of a grpc.aio channel, of every kind."""
    return [kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)]


class _SyncCallDetails(namedtuple("_SyncCallDetails", ("method", "timeout", "metadata", "credentials",
                                                       "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class SyncBearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                            grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call of a blocking channel."""

    def __init__(self, token: str) -> None:
        self._header = bearer(token)

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _SyncCallDetails(d.method, d.timeout, [*(d.metadata or ()), self._header], d.credentials,
                                getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)
