"""Tenancy at the edge on the session platform (two real gateway replicas, Redis, the real vLLM
`tiny`, and a llama.cpp model deployed for this module): API keys, identities kept apart (stored
responses, prefix cache by the engine's own cached-token counts), rate limits shared by both
gateway replicas through Redis, the bounded body, and refusal before engine work."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from tests.helpers import stream_then_drop, until_sync
from tests.integration.conftest import PLATFORM_MODELS
from tests.platform_process import PlatformProcess, mship

pytestmark = pytest.mark.integration
LLAMA = "tenancy-llama"
LLAMA_MODEL = f"""\
models:
  - name: {LLAMA}
    model: builtin:smollm2-135m-instruct
    loader: llama_cpp
    n_parallel: 2
    n_ctx: 1024
    num_cpus: 0.5
"""
# Long enough to fill whole KV blocks on both engines (cached prefixes are counted in blocks).
LONG_PROMPT = "Here is a list of facts about lighthouses and the sea. " * 24 + "Summarise them."


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def chat(platform: PlatformProcess, key: str | None, model: str = "tiny", content: str = "Hi",
         **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}
    with httpx.Client(base_url=platform.base_url, timeout=60) as c:  # a new connection: either gateway replica
        return c.post("/v1/chat/completions", json=body, headers=bearer(key) if key else {})


@pytest.fixture(scope="module")
def llama(platform: PlatformProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A llama.cpp model beside `tiny` for this module (an additive deploy), reconciled away afterwards."""
    home = Path(tmp_path_factory.mktemp("tenancy"))
    (home / "llama.yaml").write_text(LLAMA_MODEL)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "llama.yaml"), "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    yield LLAMA
    (home / "session.yaml").write_text(PLATFORM_MODELS)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "session.yaml"),
                "--reconcile", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_missing_or_wrong_key_is_401_and_a_header_is_no_key(platform):
    for headers in ({}, bearer("not-a-key"), {"x-mship-identity": "tenant-a"}, {"x-user": "tenant-a"}):
        with httpx.Client(base_url=platform.base_url, timeout=30) as c:
            for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                 ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x")):
                r = c.request(method, path, headers=headers, json={"model": "tiny", "input": "hi"})
                assert r.status_code == 401, (headers, path, r.text)
                assert r.json()["error"]["code"] == "invalid_api_key"
    assert chat(platform, "key-tenant-a").status_code == 200


def test_one_identity_cannot_read_continue_cancel_or_delete_anothers_response(platform):
    with httpx.Client(base_url=f"{platform.base_url}/v1", timeout=60, headers=bearer("key-tenant-a")) as a, \
            httpx.Client(base_url=f"{platform.base_url}/v1", timeout=60, headers=bearer("key-tenant-b")) as b:
        mine = a.post("/responses", json={"model": "tiny", "input": "Hi", "max_output_tokens": 16}).json()
        rid = mine["id"]
        assert b.get(f"/responses/{rid}").status_code == 404
        assert b.get(f"/responses/{rid}/input_items").status_code == 404
        assert b.post(f"/responses/{rid}/cancel").status_code == 404
        assert b.delete(f"/responses/{rid}").status_code == 404
        r = b.post("/responses", json={"model": "tiny", "input": "go on", "previous_response_id": rid})
        assert r.status_code == 404
        assert a.get(f"/responses/{rid}").status_code == 200  # untouched by all of that


@pytest.mark.parametrize("loader", ["vllm", "llama_cpp"])
def test_the_prefix_cache_is_shared_within_an_identity_never_across(platform, llama, loader):
    """By the engine's own cached-token counts: A twice hits, B with the same prompt does not."""
    model = "tiny" if loader == "vllm" else llama
    prompt = f"{loader}: {LONG_PROMPT}"

    def cached(key: str) -> int:
        r = chat(platform, key, model=model, content=prompt, max_tokens=1)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("key-cache-a") == 0
    assert cached("key-cache-a") > 0
    assert cached("key-cache-b") == 0


def write_limits(platform: PlatformProcess, text: str) -> None:
    (platform.log_path.parent / "rate-limits.yaml").write_text(text)


@pytest.fixture
def limits(platform: PlatformProcess) -> Iterator[None]:
    yield
    write_limits(platform, "{}\n")


def until_every_gateway_reads(platform: PlatformProcess, key: str, header: str, value: str) -> None:
    """Poll on new connections until both gateway replicas answer `key` with the new limit."""
    seen: set[str] = set()

    def both() -> bool:
        r = chat(platform, key)
        if r.headers.get(header) == value:
            seen.add(r.headers["x-mship-gateway"])
        return len(seen) == 2
    until_sync(both, f"both gateway replicas read {header}: {value}", timeout_s=30, poll_s=0.05)


def test_a_request_limit_holds_across_both_gateway_replicas_and_resets(platform, limits):
    # one back every 10 s; `tokens` only tells when both replicas have read the file
    write_limits(platform, "limits:\n  tiny: {requests_per_minute: 6}\ntokens:\n  tiny: {requests_per_minute: 6}\n")
    until_every_gateway_reads(platform, "key-tokens", "x-ratelimit-limit-requests", "6")
    replies = [chat(platform, "key-limits") for _ in range(20)]  # each on a new connection
    assert len({r.headers["x-mship-gateway"] for r in replies}) == 2
    assert [r.status_code for r in replies] == [200] * 6 + [429] * 14  # one budget, in Redis
    assert [r.headers["x-ratelimit-remaining-requests"] for r in replies[:6]] == ["5", "4", "3", "2", "1", "0"]
    refused = replies[-1]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-limit-requests"] == "6"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    # the window resets: after Retry-After (what the limiter promised), a request passes again
    time.sleep(int(refused.headers["retry-after"]))
    until_sync(lambda: chat(platform, "key-limits").status_code == 200, "a refilled request", timeout_s=5)
    assert chat(platform, "key-tenant-a").status_code == 200  # another identity was never limited


TPM = 3000  # 50 tokens back a second
RESERVE = 900  # each request's max_tokens: reserved on admission, far above what tiny really uses


def remaining_tokens(platform: PlatformProcess) -> int:
    r = chat(platform, "key-tokens", max_tokens=RESERVE)
    assert r.status_code == 200, r.text
    return int(r.headers["x-ratelimit-remaining-tokens"])


def test_a_token_limit_counts_real_usage_and_a_cancelled_stream_gives_back_its_reservation(platform, limits):
    write_limits(platform, f"tokens:\n  tiny: {{tokens_per_minute: {TPM}}}\n")
    until_every_gateway_reads(platform, "key-tokens", "x-ratelimit-limit-tokens", str(TPM))
    # Settled against real usage (a few tokens), a reservation of ~RESERVE comes back: two requests
    # in a row see nearly a whole bucket; without settling the second would see TPM - 2 * RESERVE.
    remaining_tokens(platform)
    assert remaining_tokens(platform) > TPM - RESERVE - 300
    # A stream reserving ~900 tokens, dropped after 5 chunks, keeps only what it used.
    stream_then_drop(platform.http_port, 5, headers=bearer("key-tokens"))
    until_sync(lambda: remaining_tokens(platform) > TPM - RESERVE - 300, "the dropped stream's reservation back",
               timeout_s=3, poll_s=0.2)


def gateway_rss(platform: PlatformProcess) -> list[int]:
    return [p.memory_info().rss for p in platform.find("GatewayDeployment")]


def test_a_60mb_chunked_body_is_413_without_buffering_it(platform):
    limit = 32 * 2**20
    before = gateway_rss(platform)
    peak = list(before)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for i, rss in enumerate(gateway_rss(platform)):
                peak[i] = max(peak[i], rss)
            time.sleep(0.05)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def chunks() -> Iterator[bytes]:
        for _ in range(60):
            yield b"x" * 2**20
    try:
        r = httpx.post(f"{platform.base_url}/v1/chat/completions", content=chunks(), timeout=60,
                       headers={"content-type": "application/json", **platform.headers})
    except httpx.HTTPError:  # the server may close while the client still sends: the answer is still 413
        r = None
    finally:
        done.set()
        sampler.join()
    if r is not None:
        assert r.status_code == 413
    growth = max(p - b for p, b in zip(peak, before, strict=True))
    print(f"gateway RSS growth during a 60 MB chunked upload: {growth / 2**20:.1f} MiB (limit {limit / 2**20:.0f} MiB)")
    assert growth < limit + 20 * 2**20
    assert chat(platform, "key-tenant-a").status_code == 200


def test_an_over_context_prompt_is_refused_before_any_engine_work(platform):
    (route,) = [m for m in platform.routing().models if m.name == "tiny"]
    address = f"{route.replicas[0].endpoint.host}:{route.replicas[0].endpoint.port}"

    def engine_counts() -> tuple[int, int]:
        with grpc.insecure_channel(address) as channel:
            report = worker_pb2_grpc.WorkerStub(channel).GetLoad(pb.GetLoadRequest(), timeout=10)
        return report.prompt_tokens_total, report.generated_tokens_total

    before = engine_counts()
    r = chat(platform, "key-tenant-a", content="hello " * 1500)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert engine_counts() == before


def test_regressions_from_the_fuzz_run(platform):
    """Each was a 500 or an unanswered request before."""
    with httpx.Client(base_url=platform.base_url, timeout=10, headers=platform.headers) as c:
        for body in ({"model": "tiny", "prompt": ""}, {"model": "tiny", "prompt": "", "max_tokens": 4}):
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        r = c.post("/v1/completions", content=b'{"model": "\\ud800", "prompt": "hi"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_unicode"
    assert psutil.pid_exists(platform.proc.pid)


def test_model_set_rate_limits_are_a_live_change_without_a_reload(platform, tmp_path):
    """`rate_limits` on a model applies to each identity; changing it is no new version, no new replica."""
    (before,) = platform.replicas("tiny")
    limited = tmp_path / "limited.yaml"
    limited.write_text(PLATFORM_MODELS + "    rate_limits: {requests_per_minute: 100000}\n")
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(limited), "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        until_every_gateway_reads(platform, "key-tenant-a", "x-ratelimit-limit-requests", "100000")
        (after,) = platform.replicas("tiny")
        assert (after.replica_id, after.version) == (before.replica_id, before.version)
        (spec,) = [m for m in platform.committed() if m.name == "tiny"]
        assert spec.rate_limits.requests_per_minute == 100000  # committed with the model set
    finally:
        (tmp_path / "plain.yaml").write_text(PLATFORM_MODELS)
        out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(tmp_path / "plain.yaml"),
                    "--wait")
        assert out.returncode == 0, out.stdout + out.stderr
    until_sync(lambda: "x-ratelimit-limit-requests" not in chat(platform, "key-tenant-a").headers,
               "the limit lifted", timeout_s=20, poll_s=0.1)


def test_a_key_added_to_the_file_works_on_every_gateway_and_sighup_stops_nothing(platform):
    keys = platform.log_path.parent / "api-keys"
    gateways = platform.find("GatewayDeployment")
    assert chat(platform, "key-newcomer").status_code == 401
    keys.write_text(keys.read_text() + "key-newcomer:newcomer\n")
    for process in [*gateways, psutil.Process(platform.proc.pid)]:  # what tools send after editing a file
        process.send_signal(signal.SIGHUP)
    seen: set[str] = set()

    def both_accept() -> bool:
        r = chat(platform, "key-newcomer")
        if r.status_code == 200:
            seen.add(r.headers["x-mship-gateway"])
        return len(seen) == 2
    until_sync(both_accept, "both gateway replicas accept the new key", timeout_s=30, poll_s=0.05)
    assert all(p.is_running() for p in gateways) and platform.proc.poll() is None
    assert [p.pid for p in platform.find("GatewayDeployment")] == [p.pid for p in gateways]
