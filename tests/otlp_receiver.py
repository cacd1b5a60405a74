"""An OTLP/gRPC trace receiver on 127.0.0.1 (`opentelemetry.proto.collector.trace.v1.TraceService/
Export`), for `--otel-endpoint` / `MSHIP_OTEL_ENDPOINT`: it keeps every span it is sent, with the
`service.name` of the process that sent it, for tests to find a request's trace."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a trace's root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    attributes: dict[str, Any] = field(hash=False)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(ReceivedSpan(
                        service=str(resource.get("service.name", "")), name=s.name, trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(), kind=s.kind,
                        attributes={a.key: _value(a.value) for a in s.attributes}))
        with self.receiver.lock:
            self.receiver.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.received() if s.trace_id == trace_id]

    def wait_for(self, found: Callable[[list[ReceivedSpan]], Any], timeout_s: float = 30,
                 what: str = "spans") -> Any:
        """Poll until `found(spans received so far)` is truthy; return it."""
        deadline = time.monotonic() + timeout_s
        while not (result := found(self.received())):
            assert time.monotonic() < deadline, f"no {what} within {timeout_s}s: {self.received()}"
            time.sleep(0.05)
        return result

    def close(self) -> None:
        self.server.stop(0)


def ancestors(span: ReceivedSpan, spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """`span`'s parent chain within `spans`, nearest first."""
    by_id = {s.span_id: s for s in spans}
    chain, at = [], by_id.get(span.parent_id)
    while at is not None and at not in chain:
        chain.append(at)
        at = by_id.get(at.parent_id)
    return chain
