"""Traces (OpenTelemetry), off unless the node has a collector.

`mship start` / `mship join --otel-endpoint HOST:PORT` put `MSHIP_OTEL_ENDPOINT` in the environment
of every process of the node (services/cluster/telemetry.py). `configure_tracing(service)`, called
once at the start of each replica beside `configure_logging`, then gives this process a
TracerProvider (resource `service.name=mship-<service>`) whose spans are batched to that collector
over OTLP/gRPC, and from then on everything built in this process is instrumented: every gRPC
server (`interceptors.platform_server`), every channel (`channels.aio_channel` / `sync_channel`)
and the edge app (`gateway.app.create_app`). W3C trace context (`traceparent`) travels in the HTTP
headers and the gRPC metadata, so one request is one trace: the gateway's HTTP span → its Infer
client span → the worker's Infer server span (and the state service's, for the calls it makes).

Off (no endpoint, the default): OpenTelemetry is not even imported, and those builders build
exactly what they build without tracing: no interceptor, no middleware, nothing per call or per
token. On, attributes are set once per request, never per token: `mship.model` and
`mship.identity` on the gateway's HTTP span when the request ends, the token counts
(`gen_ai.usage.*`) on the worker's Infer span from its `Final` (`record_usage`). Health checks and
heartbeats are not traced (one trace a second per replica would drown the requests).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from services.common.vocabulary import ENV_OTEL_ENDPOINT

# Kept out of traces: probes and periodic liveness calls (gRPC methods, HTTP paths as regexes), and
# the delivery streams (one per endpoint for the channel's life; their deltas belong to Infer spans).
UNTRACED_METHODS = ("Heartbeat", "Deliver")
UNTRACED_URLS = "/health$,/readyz$"

_provider: Any = None  # this process's TracerProvider once configure_tracing found an endpoint


def enabled() -> bool:
    return _provider is not None


def exporter_endpoint(value: str) -> tuple[str, bool]:
    """The OTLP exporter's (endpoint, insecure) for `HOST:PORT`, `http://HOST:PORT` or `https://HOST:PORT`."""
    if value.startswith("https://"):
        return value, False
    return (value if "://" in value else f"http://{value}"), True


def configure_tracing(service: str) -> bool:
    """Trace this process when `MSHIP_OTEL_ENDPOINT` is set (once per process); True when on."""
    global _provider
    endpoint = os.environ.get(ENV_OTEL_ENDPOINT, "").strip()
    if _provider is not None or not endpoint:
        return _provider is not None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:  # the platform extra is not installed: serve, untraced, and say so once
        print(f"mship: {ENV_OTEL_ENDPOINT}={endpoint!r} not used: {e}", file=sys.stderr)
        return False
    url, insecure = exporter_endpoint(endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": f"mship-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, insecure=insecure)))
    _provider = provider
    return True


def shutdown_tracing() -> None:
    """Export what is still batched and stop tracing what is built from now on (a process's end, tests)."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None:
        provider.shutdown()


def _traced(details: Any) -> bool:
    """The gRPC calls that get spans (the instrumentation's `filter_`): all but health and heartbeats."""
    method = details.method.decode() if isinstance(details.method, bytes) else details.method or ""
    return not method.startswith("/grpc.health.") and method.rsplit("/", 1)[-1] not in UNTRACED_METHODS


def server_interceptors() -> list[Any]:
    """The gRPC server's span interceptor (it continues the caller's trace from the metadata); [] when off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor
    return [aio_server_interceptor(tracer_provider=_provider, filter_=_traced)]


def aio_client_interceptors() -> list[Any]:
    """A grpc.aio channel's span interceptors, one per call kind (each puts `traceparent` in the
    call's metadata); [] when off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors as otel_interceptors
    return otel_interceptors(tracer_provider=_provider, filter_=_traced)


def traced_sync_channel(channel: Any) -> Any:
    """A blocking channel with client spans; the channel itself when off."""
    if _provider is None:
        return channel
    from opentelemetry.instrumentation.grpc import client_interceptor
    from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
    return intercept_channel(channel, client_interceptor(tracer_provider=_provider, filter_=_traced))


class _RequestSpanDetails:
    """Just inside the HTTP span: as the answer starts (the span ends with its last byte), names the
    span after its route template and adds the caller's identity and the model, known only then
    (after routing, auth and admission); a WebSocket's, when it ends."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            try:
                return await self.app(scope, receive, send)
            finally:
                if scope["type"] == "websocket":
                    _describe(scope)

        async def described_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                _describe(scope)
            await send(message)

        await self.app(scope, receive, described_send)


def _describe(scope: dict[str, Any]) -> None:
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.is_recording():
        return
    path = getattr(scope.get("route"), "path", None)
    if path:
        span.update_name(f"{scope['method']} {path}" if scope["type"] == "http" else path)
        span.set_attribute("http.route", path)
    caller = scope.get("state", {}).get("caller")
    if caller is not None:
        span.set_attribute("mship.identity", caller.identity)
        if caller.model:
            span.set_attribute("mship.model", caller.model)


def instrument_app(app: Any) -> None:
    """The edge app's HTTP spans (outermost: it continues a client's `traceparent`); nothing when off.
    Add it after every other middleware. No span per ASGI message: a stream's chunks cost nothing."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    app.add_middleware(_RequestSpanDetails)
    app.add_middleware(OpenTelemetryMiddleware, tracer_provider=_provider, excluded_urls=UNTRACED_URLS,
                       exclude_spans=["receive", "send"])


def record_usage(model: str, usage: Any) -> None:
    """On the current span (the worker's Infer server span), once, from its Final: the model and
    the token counts."""
    if _provider is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({"mship.model": model, "gen_ai.usage.input_tokens": usage.prompt_tokens,
                             "gen_ai.usage.output_tokens": usage.completion_tokens,
                             "mship.usage.cached_tokens": usage.cached_tokens})
