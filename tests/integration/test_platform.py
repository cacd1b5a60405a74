"""The spine on real parts: OpenAI HTTP -> gateway (Serve replica) -> gRPC stream -> worker replica
(Serve) -> vLLM, with the coordinator pushing routes. `mship start` runs as a child process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import grpc
import httpx
import openai
import pytest

from clients.client import MshipClient
from mship.state.v1 import state_pb2, state_pb2_grpc
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.launcher import GRPC_EXPERIMENTS, gateway_env
from services.worker.builtin import corpus
from tests.helpers import raw_headers, stream_then_drop
from tests.integration.conftest import PLATFORM_MODELS, TINY
from tests.load_generator import LoadGenerator
from tests.platform_process import PlatformProcess, mship
from tests.worker_calls import chat, wait_load

pytestmark = pytest.mark.integration
CANCEL_DEADLINE_S = 0.1


def worker_address(platform: PlatformProcess, model: str = "tiny") -> str:
    (route,) = [m for m in platform.routing().models if m.name == model]
    endpoint = route.replicas[0].endpoint
    return f"{endpoint.host}:{endpoint.port}"


@pytest.fixture
async def worker_stub(platform):
    async with grpc.aio.insecure_channel(worker_address(platform)) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key="test-key", max_retries=0)


def test_openai_sdk_chat_completions_and_models(client):
    prompt = "What is the capital of France?"
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=32, temperature=0)
    assert reply.choices[0].message.content == corpus.FIXED_ANSWERS[prompt]
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens > 0
    assert reply.usage.prompt_tokens_details.cached_tokens is not None

    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=64, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == corpus.FIXED_ANSWERS["Tell me a story."]
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-1].choices == []

    completion = client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 5
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_tool_calls_through_the_edge(client):
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": corpus.TOOL_PROMPT}],
                                           tools=[corpus.WEATHER_TOOL], max_tokens=96, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == corpus.EXPECTED_TOOL_CALL["name"]


async def test_client_disconnect_mid_stream_aborts_engine_work(platform, worker_stub):
    await asyncio.to_thread(stream_then_drop, platform.http_port, 5, headers=platform.headers)
    report, _ = await wait_load(worker_stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0,
                                CANCEL_DEADLINE_S)
    frozen = report.generated_tokens_total
    await asyncio.sleep(0.3)
    assert (await worker_stub.GetLoad(pb.GetLoadRequest())).generated_tokens_total == frozen


async def test_client_disconnect_before_first_token(platform, worker_stub):
    # Twelve direct calls: two hold the engine's two slots, ten queue behind them for many seconds,
    # so the HTTP request below (thirteenth in line) waits in the engine's queue without a token.
    long = pb.SamplingParams(max_tokens=1000, ignore_eos=True, temperature=0.0)
    blockers = [worker_stub.Infer(chat("Hi", sampling=long)) for _ in range(12)]
    await wait_load(worker_stub, lambda r: r.inflight_calls == 12 and r.running_requests == 2, 10.0)
    body = (b'{"model": "tiny", "stream": true, "max_tokens": 900, "ignore_eos": true, '
            b'"messages": [{"role": "user", "content": "Tell me a story."}]}')
    _, writer = await asyncio.open_connection("127.0.0.1", platform.http_port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + raw_headers(platform.headers) + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    report, _ = await wait_load(worker_stub, lambda r: r.inflight_calls == 13, 20.0)
    assert report.waiting_requests >= 3  # it is queued behind the blockers: no token yet
    writer.close()
    await wait_load(worker_stub, lambda r: r.inflight_calls == 12, CANCEL_DEADLINE_S)
    for call in blockers:  # the requests sharing the replica were unaffected until now
        call.cancel()
    await wait_load(worker_stub, lambda r: r.running_requests == 0 and r.inflight_calls == 0, 1.0)


BAD = [
    ("malformed json", b'{"model": "tiny", "messages": [', 400, None),
    ("wrong type", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
     400, "temperature"),
    ("unknown field", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}',
     400, "frobnicate"),
    ("bad value", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}',
     400, "max_tokens"),
    ("unknown model", b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
    ("over context", b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"hello " * 1500 + b'"}]}',
     400, "messages"),
]


@pytest.mark.parametrize(("case", "body", "status", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_openai_errors(platform, case, body, status, param):
    r = httpx.post(f"{platform.base_url}/v1/chat/completions", content=body,
                   headers={"content-type": "application/json", **platform.headers}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"]
    if param:
        assert error["param"] == param


def test_body_too_large_is_413(platform):
    r = httpx.post(f"{platform.base_url}/v1/chat/completions", content=b"x" * (33 * 2**20),
                   headers={"content-type": "application/json", **platform.headers}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


def test_health_and_readiness(platform):
    assert httpx.get(f"{platform.base_url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{platform.base_url}/readyz").json()
    assert ready["ready"] and ready["loaded"] == ["tiny"] and ready["pending"] == []
    assert ready["load_times_s"]["tiny"] > 0


def test_gateway_replicas_run_with_their_grpc_setting_on_top_of_the_jobs_environment(platform):
    """The gateway's own runtime environment (gRPC's legacy client I/O: docs/operations.md) merges
    into the job's, whose settings the replicas still need; no other replica gets it."""
    gateways = platform.find("ServeReplica:mship-gateway")
    assert len(gateways) == 2
    want = gateway_env(os.environ).get(GRPC_EXPERIMENTS, os.environ.get(GRPC_EXPERIMENTS))  # else the runner's
    for proc in gateways:
        env = proc.environ()
        assert env.get(GRPC_EXPERIMENTS) == want
        assert env.get("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD") == "0"  # our servers on Serve's loop
    workers = platform.find(f"ServeReplica:mship-model-{TINY}")
    assert workers and all(w.environ().get(GRPC_EXPERIMENTS) == os.environ.get(GRPC_EXPERIMENTS) for w in workers)


def test_the_node_runs_no_log_monitor_beside_the_engines(platform):
    """Ray's log monitor tails every log file of the node at nice 0, for drivers that take logs;
    the platform's takes none (log_to_driver=False), so `ray start` runs without it."""
    assert platform.find("ray/raylet/raylet") and platform.find("gcs_server")  # the node's own processes are seen
    assert platform.find("log_monitor.py") == []


async def test_python_client_low_latency_path(platform):
    async with MshipClient(platform.coordinator) as c:
        assert c.models() == ["tiny"]
        reply = await c.chat("tiny", [{"role": "user", "content": "What is 2 + 2?"}], max_tokens=16, temperature=0)
        assert (reply.text, reply.finish_reason) == ("2 + 2 = 4.", "stop")
        got = 0
        async for event in c.stream_chat("tiny", [{"role": "user", "content": "Tell me a story."}],
                                         max_tokens=900, ignore_eos=True):
            got += event.HasField("delta")
            if got == 3:
                break  # closing the stream cancels the call
        async with grpc.aio.insecure_channel(worker_address(platform)) as channel:
            await wait_load(worker_pb2_grpc.WorkerStub(channel),
                            lambda r: r.running_requests == 0 and r.inflight_calls == 0, 1.0)


def test_committed_set_is_stored_in_the_state_service(platform):
    with grpc.insecure_channel(f"127.0.0.1:{platform.state_port}") as channel:
        model_set = state_pb2_grpc.StateStub(channel).GetModelSet(state_pb2.GetModelSetRequest(), timeout=10)
    assert [m.name for m in model_set.models] == ["tiny"] and model_set.deploy_id


def test_cli_status_models_and_bad_config(platform, tmp_path):
    out = mship("--coordinator", platform.coordinator, "models")
    assert out.returncode == 0 and out.stdout.split()[0] == "tiny"
    assert "serve applications:" not in out.stdout  # Serve's own view is asked for by `status` only
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: x\n    model: builtin:tiny-qwen2\n    num_replicas: two\n")
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(bad), "--wait")
    assert out.returncode == 2
    assert str(bad) in out.stderr and "models[0].num_replicas" in out.stderr and "Fix:" in out.stderr
    out = mship("--coordinator", platform.coordinator, "status")
    assert out.returncode == 0 and "tiny" in out.stdout and " x " not in out.stdout  # nothing deployed
    assert "serve applications:" in out.stdout and "mship-model-tiny-" in out.stdout
    assert mship("--coordinator", "127.0.0.1:1", "models").returncode == 3


def test_coordinator_restart_keeps_routes(platform):
    (coordinator,) = platform.find("CoordinatorDeployment")
    with LoadGenerator(platform.base_url, TINY, clients=2, headers=platform.headers) as hammer:
        hammer.wait_for(5)
        coordinator.kill()
        deadline = time.monotonic() + 120
        while True:  # Serve starts a new coordinator replica; it serves WatchRouting again
            with contextlib.suppress(grpc.RpcError):
                snap = platform.routing()
                if [m.name for m in snap.models] == ["tiny"]:
                    break
            assert time.monotonic() < deadline, "the coordinator did not come back"
            time.sleep(0.2)
        hammer.wait_for(5)
    assert hammer.failures == []
    assert [p.pid for p in platform.find("CoordinatorDeployment")] != [coordinator.pid]


def test_reconcile_removes_and_adds_models_on_every_gateway(platform, tmp_path):
    added = tmp_path / "added.yaml"
    added.write_text("models:\n  - name: tiny2\n    model: builtin:tiny-qwen2\n    max_model_len: 512\n"
                     "    max_num_seqs: 2\n    num_cpus: 0.5\n")
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(added), "--wait")  # additive
    assert out.returncode == 0, out.stdout + out.stderr
    body = {"model": "tiny2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(f"{platform.base_url}/v1/chat/completions", timeout=60, json=body,
                      headers=platform.headers).status_code == 200
    original = tmp_path / "models.yaml"
    original.write_text(PLATFORM_MODELS)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(original), "--reconcile", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    t_done = time.monotonic()
    seen: dict[str, int] = {}
    while len(seen) < 2:  # new connections until both gateway replicas have answered
        assert time.monotonic() - t_done < 30, f"only saw gateway replicas {seen}"
        with httpx.Client(base_url=platform.base_url, headers=platform.headers) as http:
            r = http.post("/v1/chat/completions", json=body)
        seen[r.headers["x-mship-gateway"]] = r.status_code
    assert set(seen.values()) == {404}
    r = httpx.post(f"{platform.base_url}/v1/chat/completions", timeout=60, json={**body, "model": "tiny"},
                   headers=platform.headers)
    assert r.status_code == 200  # the model the reconcile kept was never touched
    assert platform.find("mship-model-tiny2-") == []  # the removed model's replica is gone


def test_readyz_waits_for_the_start_model_and_sigterm_stops_everything_within_30s(tmp_path):
    """A platform of its own, `mship start --model ...`: from the moment its HTTP port answers,
    /readyz is never 200 while /v1/models lacks the model (polled every 200 ms, as a probe would).
    Then SIGTERM ends it and every process it started."""
    platform = PlatformProcess.start(None, tmp_path / "mship.log", gateway_replicas=1, extra=(
        "--model", "builtin:tiny-qwen2", "--name", "asked-for", "--max-model-len", "512"))
    polls: list[tuple[int, bool]] = []
    try:
        deadline = time.monotonic() + 600
        while not polls or polls[-1][0] != 200:
            assert time.monotonic() < deadline and platform.proc.poll() is None, platform.tail()
            try:
                ready = httpx.get(f"{platform.base_url}/readyz", timeout=2).status_code
                listed = "asked-for" in httpx.get(f"{platform.base_url}/v1/models", timeout=2).text
            except httpx.HTTPError:
                if polls:
                    raise
                time.sleep(0.2)  # the port does not answer yet: nothing to poll
                continue
            polls.append((ready, listed))
            time.sleep(0.2)  # a probe's period
        assert len(polls) > 1 and polls[0] == (503, False)  # the port answered long before the model served
        assert all(listed for status, listed in polls if status == 200), polls
        platform.wait_ready()
        started = platform.descendants()
        assert platform.find("CoordinatorDeployment") and platform.find("GatewayDeployment")
    finally:
        took = platform.stop()
    assert took < 30 and platform.proc.returncode == 0
    assert [p for p in started if p.is_running() and p.status() != "zombie"] == []
