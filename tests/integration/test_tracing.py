"""Traces on the session platform (`--otel-endpoint` to the session's OTLP receiver): one chat
request is one trace, with the gateway replica's HTTP span and the worker replica's Infer span
(each process under its own service.name), the worker's descending from the gateway's."""

from __future__ import annotations

import secrets

import httpx
import pytest

from tests.integration.conftest import TINY
from tests.otlp_receiver import OtlpReceiver, ancestors

pytestmark = pytest.mark.integration
INFER = "/mship.worker.v1.Worker/Infer"


def test_one_chat_request_is_one_trace_across_gateway_and_worker(platform, otlp: OtlpReceiver):
    trace_id = secrets.token_hex(16)
    headers = {**platform.headers, "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    body = {"model": TINY, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(f"{platform.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text

    def linked(received):  # batched: the worker's and the gateway's spans each come within seconds
        spans = [s for s in received if s.trace_id == trace_id]
        http = [s for s in spans if s.service == "mship-gateway" and s.name == "POST /v1/chat/completions"]
        infer = [s for s in spans if s.service == "mship-worker" and s.name == INFER]
        return (http[0], infer[0], spans) if http and infer else None

    http, infer, spans = otlp.wait_for(linked, timeout_s=30, what=f"gateway and worker spans of {trace_id}")
    assert http in ancestors(infer, spans), spans
    assert http.attributes["mship.model"] == TINY and http.attributes["mship.identity"] == "tests"
    assert infer.attributes["gen_ai.usage.input_tokens"] > 0
    assert 0 < infer.attributes["gen_ai.usage.output_tokens"] <= 4
