"""The gateway's Prometheus series (docs/metrics.md) and the one middleware that records them per
request: counts by route, model and status, duration, in-flight, refusals by error code. What only
the worker call knows (time to the first token, the mean gap between tokens, a client that went
away mid-generation) is recorded when the call is released (`record_generation`), from counts the
stream keeps: nothing is observed per token.

In a platform every process of a node writes its values into the node's metrics directory
(prometheus_client's multiprocess mode) and the node serves them on its one metrics port
(services/cluster/telemetry.py).
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)

REQUESTS = Counter("mship_gateway_requests", "HTTP requests answered", ["route", "model", "status"])
DURATION = Histogram("mship_gateway_request_duration_seconds", "HTTP request duration (to the last byte)",
                     ["route", "model"], buckets=LATENCY_BUCKETS)
INFLIGHT = Gauge("mship_gateway_inflight_requests", "HTTP requests being answered", multiprocess_mode="livesum")
REJECTIONS = Counter("mship_gateway_rejections", "requests refused with 429/503 (rate limits, backpressure, "
                     "not serving)", ["model", "status", "code"])
TTFT = Histogram("mship_gateway_time_to_first_token_seconds", "request arrival -> the worker's first event",
                 ["route", "model"], buckets=LATENCY_BUCKETS)
TOKEN_GAP = Histogram("mship_gateway_inter_token_seconds", "mean gap between a generation's events, one "
                      "observation per generation", ["route", "model"], buckets=TOKEN_GAP_BUCKETS)
WAITING = Gauge("mship_gateway_waiting_requests", "worker calls waiting for their first event (the edge's queue)",
                ["model"], multiprocess_mode="livesum")
DISCONNECTS = Counter("mship_gateway_disconnect_cancellations", "worker calls cancelled because the client went "
                      "away (or its deadline passed) before the end", ["route", "model"])
AUDIT_DROPPED = Counter("mship_gateway_audit_records_dropped", "audit records not written: too many waited "
                        "for a stalled or failing audit log, or it still failed when the replica stopped")
PREFIX = "/v1/"


@dataclass
class RequestRecord:
    """What the middleware knows of the request it is answering (the calls it makes read it)."""

    scope: dict
    started: float
    model: str = ""

    @property
    def route(self) -> str:
        """The matched route's template (bounded label values), once routing has run."""
        return getattr(self.scope.get("route"), "path", "other")


current_request: ContextVar[RequestRecord | None] = ContextVar("mship_request_record", default=None)


class MetricsMiddleware:
    """Inside the request-id middleware, outside everything else (refusals are counted too)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            return await self.app(scope, receive, send)
        record = RequestRecord(scope, time.monotonic())
        token = current_request.set(record)
        status = [0]

        async def observed_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        INFLIGHT.inc()
        try:
            await self.app(scope, receive, observed_send)
        finally:
            INFLIGHT.dec()
            current_request.reset(token)
            route = record.route
            state = scope.get("state") or {}
            caller = state.get("caller")
            model = record.model or (caller.model if caller is not None and caller.model else "")
            REQUESTS.labels(route, model, str(status[0] or 500)).inc()
            DURATION.labels(route, model).observe(time.monotonic() - record.started)
            if status[0] in (429, 503):
                REJECTIONS.labels(model, str(status[0]), state.get("error_code") or "").inc()


def waiting(model: str) -> Gauge | None:
    """The edge's queue gauge of `model` for a call about to wait for its first event (None: off)."""
    return WAITING.labels(model) if current_request.get() is not None else None


def record_generation(model: str, first_at: float, last_at: float, events: int, cut_short: bool) -> None:
    """A worker call's release: its time to the first event, its mean gap between events, and
    whether the edge cut it short (the client went away). Monotonic times."""
    record = current_request.get()
    if record is None:  # metrics off (no middleware), or a call outside any request
        return
    route, record.model = record.route, model
    TTFT.labels(route, model).observe(first_at - record.started)
    if events > 1:
        TOKEN_GAP.labels(route, model).observe((last_at - first_at) / (events - 1))
    if cut_short:
        DISCONNECTS.labels(route, model).inc()
