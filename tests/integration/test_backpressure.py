"""Backpressure on the session platform's real vLLM worker: the model's `max_ongoing_requests` /
`max_queued_requests` change on the running replica without a reload (a deploy re-limits it; the
replica applies the new limits from its next heartbeat); a burst past them is refused at once with
503 + Retry-After, while every admitted request completes; `mship status` shows the queue."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.helpers import until_sync
from tests.integration.conftest import PLATFORM_MODELS, TINY
from tests.platform_process import PlatformProcess, mship

pytestmark = pytest.mark.integration

BURST = 8
LIMITED = PLATFORM_MODELS + "    max_ongoing_requests: 1\n    max_queued_requests: 1\n"


@dataclass
class Answer:
    status: int
    retry_after: str | None
    code: str | None
    at: float  # when its status line arrived (time.monotonic)
    done: float  # when the whole body was read
    complete: bool  # a 200 stream that ended with [DONE] and no error event


def status_of(platform: PlatformProcess) -> dict:
    out = mship("--coordinator", platform.coordinator, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def tiny_replica(platform: PlatformProcess) -> dict:
    (model,) = [m for m in status_of(platform)["models"] if m["name"] == TINY]
    (replica,) = model["replicas"]
    return replica


def queued(platform: PlatformProcess) -> int:
    return sum(r.queued_requests for m in platform.cluster_status().models if m.name == TINY for r in m.replicas)


def deploy(platform: PlatformProcess, text: str, tmp_path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(path), "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reload" in out.stdout or "updated" in out.stdout, out.stdout  # re-limited, not a new version


def send(platform: PlatformProcess, answers: list[Answer], lock: threading.Lock, go: threading.Barrier) -> None:
    # Long enough (ignore_eos) that the admitted two still run when the last of the burst arrives.
    body = {"model": TINY, "max_tokens": 400, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Count."}]}
    with httpx.Client(base_url=platform.base_url, headers=platform.headers, timeout=120) as http:
        http.get("/health")  # connected before the burst
        go.wait()
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            at = time.monotonic()
            text = r.read().decode()
    code = json.loads(text)["error"]["code"] if r.status_code != 200 else None
    complete = r.status_code == 200 and text.rstrip().endswith("data: [DONE]") and '"error"' not in text
    with lock:
        answers.append(Answer(r.status_code, r.headers.get("retry-after"), code, at, time.monotonic(), complete))


def test_a_burst_past_the_limits_is_refused_at_once_and_every_admitted_request_completes(platform, tmp_path):
    before = tiny_replica(platform)
    deploy(platform, LIMITED, tmp_path)
    try:
        until_sync(lambda: tiny_replica(platform)["max_ongoing_requests"] == 1, "the replica applies the limits",
                   timeout_s=15)
        assert tiny_replica(platform)["replica_id"] == before["replica_id"]  # the same replica: no reload
        answers: list[Answer] = []
        lock = threading.Lock()
        go = threading.Barrier(BURST)
        threads = [threading.Thread(target=send, args=(platform, answers, lock, go)) for _ in range(BURST)]
        queued_seen = []
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):  # the queue, as `mship status` shows it (ClusterStatus)
            queued_seen.append(queued(platform))
        for t in threads:
            t.join()
        ok = [a for a in answers if a.status == 200]
        refused = [a for a in answers if a.status != 200]
        assert len(ok) == 2 and all(a.complete for a in ok), answers  # one running, one queued; both complete
        assert len(refused) == BURST - 2
        assert all((a.status, a.code) == (503, "overloaded") and a.retry_after == "1" for a in refused), refused
        # Refused at once: every refusal arrived before the first admitted request was done.
        assert max(a.at for a in refused) < min(a.done for a in ok)
        assert 1 in queued_seen, queued_seen
        latencies = sorted(a.at - min(x.at for x in answers) for a in refused)
        print(f"refusals arrived within {latencies[-1] * 1000:.0f} ms of the first answer")
    finally:
        deploy(platform, PLATFORM_MODELS, tmp_path)
        until_sync(lambda: tiny_replica(platform)["max_ongoing_requests"] == before["max_ongoing_requests"],
                   "the default limits again", timeout_s=15)
