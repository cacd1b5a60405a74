"""The state service's Prometheus series (docs/metrics.md): each operation's latency and errors, by
backend (memory | redis) and operation (the RPC method), recorded by one server interceptor."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

log = logging.getLogger(__name__)
OPERATION = Histogram("mship_state_operation_seconds", "state service operations", ["backend", "op"],
                      buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
ERRORS = Counter("mship_state_errors", "state operations that failed, by gRPC code", ["backend", "op", "code"])


class StateMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every unary call (the state service has no streaming ones but the health watch)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        op, behavior = details.method.rsplit("/", 1)[-1], handler.unary_unary

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0 = time.perf_counter()
            try:
                return await behavior(request, context)
            except BaseException:
                ERRORS.labels(self.backend, op, _code(context)).inc()
                raise
            finally:
                elapsed = time.perf_counter() - t0
                OPERATION.labels(self.backend, op).observe(elapsed)
                log.debug("%s on %s in %.2f ms", op, self.backend, elapsed * 1000)  # with the caller's request id
        return grpc.unary_unary_rpc_method_handler(timed, handler.request_deserializer, handler.response_serializer)


def _code(context: grpc.aio.ServicerContext) -> str:
    code = context.code() if hasattr(context, "code") else None
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
