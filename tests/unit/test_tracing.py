"""Traces (services/common/tracing.py): on, one chat request through the real edge app and a real
worker servicer (grpc.aio, engine double) is one trace, continued from the client's `traceparent`,
whose worker Infer span descends from the gateway's HTTP span, with the model, the identity and
the token counts; off, nothing of it is built or even imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from services.common import tracing
from services.common.vocabulary import ENV_OTEL_ENDPOINT
from services.gateway.identity import ApiKeys, Authenticator
from tests.engine_double import ScriptedEngine, ServedWorker, serve_worker
from tests.helpers import until
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, ancestors
from tests.unit.gateway_harness import CHAT, SCRIPT, Gateway, sse

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
INFER = "/mship.worker.v1.Worker/Infer"
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


@pytest.fixture
def traced(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """This process traces to `receiver` for the test (what it builds meanwhile is instrumented)."""
    monkeypatch.setenv(ENV_OTEL_ENDPOINT, receiver.endpoint)
    assert tracing.configure_tracing("test")
    try:
        yield receiver
    finally:
        tracing.shutdown_tracing()
    assert not tracing.enabled()


@pytest.fixture
async def traced_edge(traced: OtlpReceiver) -> AsyncIterator[tuple[Gateway, ServedWorker]]:
    worker = await serve_worker(ScriptedEngine(SCRIPT))
    gateway = Gateway(authenticator=Authenticator(ApiKeys("key-t:team-t")))
    await gateway.route(worker.address)
    try:
        yield gateway, worker
    finally:
        await gateway.stop()
        await worker.server.stop(0)


async def test_one_chat_request_is_one_trace_from_the_edge_to_the_worker(traced_edge, traced: OtlpReceiver):
    gateway, _ = traced_edge
    headers = {"authorization": "Bearer key-t", "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=10) as client:
        r, events = await sse(client, "/v1/chat/completions", {**CHAT, "stream": True})
    assert r.status_code == 200 and events[-1] == "[DONE]"

    def finished() -> list[ReceivedSpan] | None:
        tracing._provider.force_flush()
        spans = traced.trace(CLIENT_TRACE)
        names = {s.name for s in spans}
        return spans if {"POST /v1/chat/completions", INFER} <= names else None

    await until(lambda: finished() is not None, "the gateway's and the worker's spans")
    spans = finished()
    assert spans is not None
    http = next(s for s in spans if s.name == "POST /v1/chat/completions")
    worker_span = next(s for s in spans if s.name == INFER and s.kind == SERVER)
    call = next(s for s in spans if s.name == INFER and s.kind == CLIENT)
    # W3C trace context: the client's -> the edge's HTTP span -> its Infer call -> the worker's handler
    assert http.parent_id == CLIENT_SPAN and http.kind == SERVER
    assert call.parent_id == http.span_id and worker_span.parent_id == call.span_id
    assert http in ancestors(worker_span, spans)
    assert http.attributes["mship.model"] == CHAT["model"] and http.attributes["mship.identity"] == "team-t"
    assert http.attributes["http.route"] == "/v1/chat/completions"
    assert worker_span.attributes["mship.model"] == CHAT["model"]
    assert worker_span.attributes["gen_ai.usage.input_tokens"] == 2  # "say hi": a token per word
    assert worker_span.attributes["gen_ai.usage.output_tokens"] == len(SCRIPT)
    assert all(s.service == "mship-test" for s in spans)
    assert not [s for s in spans if " send" in s.name or " receive" in s.name], "no span per ASGI message"


async def test_health_checks_are_not_traced(traced_edge, traced: OtlpReceiver):
    gateway, worker = traced_edge
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        assert (await client.get("/health")).status_code == 200
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    async with grpc.aio.insecure_channel(worker.address) as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    tracing._provider.force_flush()
    assert not [s for s in traced.received() if "health" in s.name.lower()]


def test_traced_builders_add_the_instrumentation(traced: OtlpReceiver):
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.instrumentation.grpc._aio_server import OpenTelemetryAioServerInterceptor

    from services.common.interceptors import server_interceptors
    from services.common.routes import RouteTable
    from services.gateway.app import GatewaySettings, create_app
    assert isinstance(server_interceptors()[0], OpenTelemetryAioServerInterceptor)
    assert len(tracing.aio_client_interceptors()) == 4  # one per call kind
    app = create_app(RouteTable(), GatewaySettings())
    assert app.user_middleware[0].cls is OpenTelemetryMiddleware  # outermost


def test_the_endpoint_may_name_its_scheme():
    assert tracing.exporter_endpoint("127.0.0.1:4317") == ("http://127.0.0.1:4317", True)
    assert tracing.exporter_endpoint("http://collector:4317") == ("http://collector:4317", True)
    assert tracing.exporter_endpoint("https://collector:4317") == ("https://collector:4317", False)


OFF = """
import sys
from services.common import tracing
from services.common.channels import aio_channel, sync_channel
from services.common.interceptors import platform_server, server_interceptors
from services.common.routes import RouteTable
from services.gateway.app import GatewaySettings, create_app
from services.gateway.edge.audit import AuditMiddleware
from services.gateway.edge.auth import AuthMiddleware
from services.gateway.edge.limits import BodyLimitMiddleware
from services.gateway.edge.metrics import MetricsMiddleware
from services.gateway.edge.request_id import RequestIdMiddleware
from mship.worker.v1 import worker_pb2_grpc

assert tracing.configure_tracing("gateway") is False and not tracing.enabled()
assert [type(i).__name__ for i in server_interceptors()] == ["RequestIdInterceptor", "ErrorInterceptor"]
server = platform_server(worker_pb2_grpc.add_WorkerServicer_to_server, worker_pb2_grpc.WorkerServicer())
import grpc
channel = aio_channel("127.0.0.1:1")
assert not (channel._unary_unary_interceptors or channel._unary_stream_interceptors
            or channel._stream_unary_interceptors or channel._stream_stream_interceptors)
assert type(sync_channel("127.0.0.1:1")) is grpc._channel.Channel  # not an intercepted one
app = create_app(RouteTable(), GatewaySettings(audit_log="-"))
assert [m.cls for m in app.user_middleware] == [RequestIdMiddleware, MetricsMiddleware, AuditMiddleware,
                                               AuthMiddleware, BodyLimitMiddleware], app.user_middleware
assert app.build_middleware_stack.__func__ is type(app).build_middleware_stack
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
print("off")
"""


def test_off_builds_what_it_builds_without_tracing_and_imports_nothing_of_it():
    env = {k: v for k, v in os.environ.items() if k != ENV_OTEL_ENDPOINT}
    out = subprocess.run([sys.executable, "-c", OFF], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "off", out.stdout + out.stderr


def test_off_in_process_adds_nothing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_OTEL_ENDPOINT, raising=False)
    assert not tracing.configure_tracing("test")
    assert tracing.server_interceptors() == [] and tracing.aio_client_interceptors() == []
    channel = object()
    assert tracing.traced_sync_channel(channel) is channel
