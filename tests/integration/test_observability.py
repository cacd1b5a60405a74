"""Metrics and logs on the session platform (real Ray, Serve, vLLM, Redis): a known set of requests
(chat, streamed chat, a Responses call, one cancelled mid-stream, one refused) moves the documented
series by exactly that much on the node's metrics port, the histograms get samples, vLLM's own
series are there with the model's name, the head's file_sd file lists the port; one request's id
comes back in its header and in gateway and worker JSON lines received over syslog."""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import TINY
from tests.platform_process import PlatformProcess

pytestmark = pytest.mark.integration
CHAT = "/v1/chat/completions"


def scrape(platform: PlatformProcess) -> Counter:
    """Every sample on the node's port: (name, sorted labels) -> value."""
    text = httpx.get(f"http://127.0.0.1:{platform.metrics_port}/metrics", timeout=10).text
    out: Counter = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] += s.value
    return out


def value(samples: Counter, name: str, **labels: str) -> float:
    """The sum over the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def delta(before: Counter, after: Counter, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_a_known_set_of_requests_moves_the_documented_series(platform):
    http = httpx.Client(base_url=platform.base_url, headers=platform.headers, timeout=60)
    body = {"model": TINY, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    before = scrape(platform)
    for _ in range(2):
        assert http.post(CHAT, json=body).status_code == 200
    with http.stream("POST", CHAT, json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
    assert http.post("/v1/responses", json={"model": TINY, "input": "Hi", "max_output_tokens": 16}).status_code == 200
    with httpx.Client(base_url=platform.base_url, headers=platform.headers, timeout=60) as own, \
            own.stream("POST", CHAT, json={**body, "max_tokens": 1000, "stream": True, "ignore_eos": True}) as r:
        next(r.iter_lines())  # the first chunk, then the client goes away (its own connection closes)
    assert http.post(CHAT, json={**body, "model": "no-such-model"}).status_code == 404

    def cancelled() -> tuple[float, float]:
        now = scrape(platform)
        return (delta(before, now, "mship_gateway_disconnect_cancellations_total", model=TINY),
                delta(before, now, "mship_worker_requests_total", model=TINY, outcome="cancelled"))
    deadline = time.monotonic() + 15
    while (seen := cancelled()) != (1, 1):  # (edge disconnects, worker cancellations)
        assert time.monotonic() < deadline, f"the cancellation not counted at the edge and the worker: {seen}"
        time.sleep(0.2)
    after = scrape(platform)

    assert delta(before, after, "mship_gateway_requests_total", route=CHAT, model=TINY, status="200") == 4
    assert delta(before, after, "mship_gateway_requests_total", route="/v1/responses", model=TINY,
                 status="200") == 1
    assert delta(before, after, "mship_gateway_requests_total", route=CHAT, status="404") == 1
    assert delta(before, after, "mship_gateway_time_to_first_token_seconds_count", model=TINY) == 5
    # one observation per generation of two events or more (a reply that is only its Final has no gap)
    assert 3 <= delta(before, after, "mship_gateway_inter_token_seconds_count", model=TINY) <= 5
    assert delta(before, after, "mship_gateway_request_duration_seconds_count", route=CHAT) == 5
    assert delta(before, after, "mship_gateway_time_to_first_token_seconds_sum", model=TINY) > 0
    assert delta(before, after, "mship_worker_requests_total", model=TINY, outcome="finished") == 4
    assert delta(before, after, "mship_worker_generation_tokens_total", model=TINY) >= 4 * 1
    assert delta(before, after, "mship_worker_prompt_tokens_total", model=TINY) > 0
    assert delta(before, after, "mship_state_operation_seconds_count", backend="redis", op="PutResponse") >= 1
    assert value(after, "mship_coordinator_deploys_total", outcome="succeeded") >= 1
    assert value(after, "mship_coordinator_replicas", model=TINY, state="ready") == 1
    assert value(after, "mship_coordinator_routing_version") > 0
    assert value(after, "mship_worker_load_seconds", model=TINY) > 0
    assert value(after, "mship_gateway_inflight_requests") == 0
    # vLLM's own series, as vLLM defines them, with the served name
    assert delta(before, after, "vllm:request_success_total", model_name=TINY) >= 4
    assert value(after, "vllm:kv_cache_usage_perc", model_name=TINY) >= 0
    # the head's file_sd file
    assert f"127.0.0.1:{platform.metrics_port}" in json.loads(platform.sd_file().read_text())[0]["targets"]


def test_one_request_id_in_the_header_and_in_gateway_worker_and_state_json_lines(platform, syslog):
    rid = f"obs-{time.monotonic_ns()}"
    r = httpx.post(f"{platform.base_url}/v1/responses", headers={**platform.headers, "x-request-id": rid},
                   timeout=60, json={"model": TINY, "input": "Hi", "max_output_tokens": 16})  # stored: a state call
    assert r.status_code == 200 and r.headers["x-request-id"] == rid
    gateway = syslog.wait_for(request_id=rid, service="gateway")
    worker = syslog.wait_for(request_id=rid, service="worker")
    state = syslog.wait_for(request_id=rid, service="state")
    assert any("/v1/responses" in rec["message"] and "200" in rec["message"] for rec in gateway), gateway
    assert any(rec["message"].startswith("infer ") for rec in worker), worker
    assert any(rec["message"].startswith("PutResponse ") for rec in state), state
    assert all(rec["level"] == "DEBUG" and rec["pid"] for rec in gateway + worker + state)
