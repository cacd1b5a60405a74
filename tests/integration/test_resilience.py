"""Keeps serving through load, crashes and scale changes, on a platform of its own (real Ray, Serve,
vLLM and llama.cpp) with clients hammering it throughout:

- the gateways autoscale on their in-flight requests (1 -> 2 under sustained load; the new replica
  holds the routes before it takes traffic), and a gateway replica SIGKILLed under load fails only
  the requests in flight on it;
- a llama-server SIGKILLed under load: its replica reports unhealthy, requests without a token yet
  go to the other replica, Serve replaces it and it serves again, nobody hangs;
- a model autoscaled to zero idles there and serves its first request after a cold start;
- a vLLM model scales 1 -> 2 under sustained load and back to 1 after it, with no failed request;
- a vLLM EngineCore SIGKILLed under load: no request hangs, the replica is replaced on its own;
- a hung engine (SIGSTOPped: alive, no progress) under load, llama-server and vLLM's EngineCore:
  killed by its replica's health check after the model's stall_timeout_s, then as for a crash.

The tests run in this order and build on one platform.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import psutil
import pytest

from mship.worker.v1 import worker_pb2, worker_pb2_grpc
from services.gateway.edge.http_server import migrates_queued_connections
from tests.helpers import until_sync as until
from tests.load_generator import LoadGenerator
from tests.platform_process import PlatformProcess

pytestmark = pytest.mark.integration

MODELS = """\
models:
  - name: auto
    model: builtin:tiny-qwen2
    max_model_len: 512
    max_num_seqs: 4
    num_cpus: 0.5
    stall_timeout_s: 8
    autoscaling_config: {min_replicas: 1, max_replicas: 2, target_ongoing_requests: 2, upscale_delay_s: 0,
                         downscale_delay_s: 4}
  - name: pair
    model: builtin:tiny-qwen2
    loader: llama_cpp
    n_ctx: 512
    n_parallel: 2
    num_cpus: 0.25
    num_replicas: 2
    stall_timeout_s: 4
  - name: zero
    model: builtin:tiny-qwen2
    loader: llama_cpp
    n_ctx: 512
    num_cpus: 0.25
    autoscaling_config: {min_replicas: 0, max_replicas: 1, downscale_delay_s: 2}
"""
GATEWAY_TARGET = 4  # in-flight HTTP requests per gateway replica


@pytest.fixture(scope="module")
def res(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformProcess]:
    home = Path(tmp_path_factory.mktemp("resilience"))
    (home / "models.yaml").write_text(MODELS)
    proc = PlatformProcess.start(home / "models.yaml", home / "mship.log", gateway_replicas=None, extra=(
        "--gateway-min-replicas", "1", "--gateway-max-replicas", "2",
        "--gateway-target-ongoing-requests", str(GATEWAY_TARGET)))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def replica_ids(platform: PlatformProcess, model: str) -> set[str]:
    return {r.replica_id for r in platform.replicas(model)}


def child(pid: int, *fragments: str) -> psutil.Process:
    """The engine process a worker replica started (llama-server, vLLM's EngineCore): the first
    whose name or command line holds one of `fragments`."""
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if any(f in p.name() or f in " ".join(p.cmdline()) for f in fragments):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"none of {fragments} under pid {pid}")


def generated_tokens(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        report = worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=10)
    return report.generated_tokens_total


def assert_clean(failures: list[str], transport: bool = False) -> None:
    """Failed requests failed cleanly and at once: a 503 (with its OpenAI error) or an error event in
    the stream, never a timeout or a 500; a broken connection only where a gateway died (`transport`)."""
    for f in failures:
        broken = "RemoteProtocolError" in f or "ReadError" in f or "ConnectError" in f or "without [DONE]" in f
        assert ": 503 " in f or ("error chunk in stream" in f and "server_error" in f) or (transport and broken), f


def test_gateways_scale_out_under_load_and_a_killed_one_fails_only_its_in_flight_requests(res):
    first = httpx.get(f"{res.base_url}/readyz", timeout=5)
    assert first.status_code == 200 and len(res.find("mship-gateway")) == 1
    # Up to two replicas share the port: `mship start` warned where a dying one resets its queue.
    warned = "net.ipv4.tcp_migrate_req is 0" in res.log_path.read_text(errors="replace")
    assert warned != migrates_queued_connections()
    with LoadGenerator(res.base_url, "pair", clients=3 * GATEWAY_TARGET, max_tokens=48, fresh_connections=True,
                       timeout_s=60) as load:
        load.wait_for(10)
        until(lambda: len(load.servers(since=time.monotonic() - 5)) == 2, "a second gateway replica serves",
              timeout_s=120)
        assert load.failures == []  # the new replica took traffic only once it had the routes
        victim = res.find("mship-gateway")[0]
        kill_sent = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)  # gone, its listening socket with it
        gone_at = time.monotonic()
        load.wait_for(20)  # the other replica (and then the replacement) serve the clients
    # Failed: the requests in flight on the victim, and connections the kernel still queued on its
    # listening socket while it died (tens of ms): Linux resets those when the socket closes (unless
    # net.ipv4.tcp_migrate_req=1), so a client whose request broke can lose its next one too.
    timeline = [(f.client, round(f.started - kill_sent, 4), round(f.ended - kill_sent, 4), f.error)
                for f in load.failed]
    outside = [f for f in load.failed if f.ended < kill_sent or f.started >= gone_at]
    assert outside == [], (gone_at - kill_sent, timeline)  # none before the kill, none started once it was gone
    assert_clean(load.failures, transport=True)
    until(lambda: len(res.find("mship-gateway")) >= 1 and
          httpx.get(f"{res.base_url}/readyz", timeout=5).status_code == 200, "ready again", timeout_s=60)


def test_a_killed_llama_server_is_replaced_and_requests_without_a_token_go_to_the_other_replica(res):
    before = res.replicas("pair")
    assert len(before) == 2
    victim = before[0]
    with LoadGenerator(res.base_url, "pair", clients=4, max_tokens=24, timeout_s=60) as load:
        load.wait_for(8)
        server = child(victim.pid, "llama-server", "services.worker.llama_portable")  # the CPU decides which
        server.kill()
        server.wait(10)  # gone (a request sent meanwhile may still have been answered by it)
        killed_at = time.monotonic()
        until(lambda: victim.replica_id not in replica_ids(res, "pair"), "the dead replica leaves routing",
              timeout_s=10)
        served = load.ok
        until(lambda: load.ok >= served + 8, "the other replica serves meanwhile", timeout_s=30)
        until(lambda: len(replica_ids(res, "pair") - {victim.replica_id}) == 2, "Serve replaced it", timeout_s=120)
        load.wait_for(8)
    assert all(f.started < killed_at for f in load.failed), load.failed  # only what was in flight on it
    assert len(load.failed) <= 4, load.failed  # at most what the clients had in flight
    assert_clean(load.failures)


@contextlib.contextmanager
def hang(engine: psutil.Process) -> Iterator[None]:
    """SIGSTOP `engine` (a hang: alive, its sockets open, no progress); SIGKILL it at the end if the
    platform has not."""
    engine.suspend()
    try:
        yield
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            engine.kill()


def ended(process: psutil.Process) -> bool:
    """Killed: gone, or a zombie its parent has yet to reap."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_hung_engine_replaced(platform: PlatformProcess, model: str, engine_of, clients: int, limit_s: float,
                                replace_s: float) -> None:
    """Under load, one replica's engine hangs: the replica kills it (it is gone within the limit, the
    health check's period and a probe), leaves routing, is replaced; nobody hangs, failures are clean,
    and where another replica serves, only among the requests that were on it."""
    victim, *others = platform.replicas(model)
    # Distinct prompts: one prompt's prefix-affinity key would keep the whole load on one replica,
    # which may not be the victim, and an idle engine has nothing to show a stall with.
    with LoadGenerator(platform.base_url, model, clients=clients, max_tokens=24, timeout_s=60,
                       distinct_prompts=True) as load:
        load.wait_for(4)
        engine = engine_of(victim.pid)
        with hang(engine):
            hung_at = time.monotonic()
            until(lambda: ended(engine), "the replica kills its hung engine", timeout_s=limit_s + 2 + 5 + 15)
            killed_s = time.monotonic() - hung_at
            until(lambda: replica_ids(platform, model) - {victim.replica_id}, "Serve replaces the replica",
                  timeout_s=replace_s)
        load.wait_for(4)  # new requests succeed
    print(f"{model}: a hung engine killed {killed_s:.1f}s after it hung; {len(load.failed)} requests failed, "
          f"{load.ok} succeeded")
    assert killed_s >= limit_s - 1, killed_s  # not before its limit (from the last request that ended on it)
    assert_clean(load.failures)
    assert not [f for f in load.failed if f.ended - f.started > 50], load.failed  # nobody waited out the client
    if others:  # the other replica served meanwhile (alone, the model is unavailable until replaced: 503s)
        assert all(f.started < hung_at + killed_s for f in load.failed), load.failed


def test_a_hung_llama_server_is_killed_and_its_replica_replaced(res):
    assert_hung_engine_replaced(res, "pair", lambda pid: child(pid, "llama-server", "services.worker.llama_portable"),
                                clients=4, limit_s=4, replace_s=120)


def test_a_model_at_zero_replicas_serves_its_first_request_after_a_cold_start(res):
    until(lambda: not res.replicas("zero"), "the deploy's replica idles to zero", timeout_s=120)
    ready = httpx.get(f"{res.base_url}/readyz", timeout=5)
    assert ready.status_code == 200, ready.text  # a model at zero is not "pending"
    assert ready.json()["models"]["zero"]["state"] == "scaled_to_zero"
    t0 = time.monotonic()
    r = httpx.post(f"{res.base_url}/v1/chat/completions", timeout=180, json={
        "model": "zero", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
    cold_start_s = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None, r.text
    assert len(res.replicas("zero")) == 1
    print(f"cold start of a llama.cpp model from zero replicas: {cold_start_s:.1f}s")
    until(lambda: not res.replicas("zero"), "idle again, it goes back to zero", timeout_s=120)


def test_sustained_load_scales_a_vllm_model_to_its_max_and_back_with_no_failed_request(res):
    (original,) = res.replicas("auto")
    with LoadGenerator(res.base_url, "auto", clients=6, max_tokens=48, timeout_s=120) as load:
        load.wait_for(5)
        t0 = time.monotonic()
        until(lambda: len(res.replicas("auto")) == 2, "a second replica", timeout_s=300)
        (new,) = [r for r in res.replicas("auto") if r.replica_id != original.replica_id]
        address = f"{new.endpoint.host}:{new.endpoint.port}"
        warm = generated_tokens(address)
        until(lambda: generated_tokens(address) > warm + 48, "the new replica serves", timeout_s=60)
        print(f"load start -> second vLLM replica serving: {time.monotonic() - t0:.1f}s")
    until(lambda: len(res.replicas("auto")) == 1, "back to one replica after the load", timeout_s=120)
    assert load.failures == [] and load.ok > 0


def test_a_killed_engine_core_fails_only_cleanly_and_the_replica_is_replaced(res):
    (victim,) = res.replicas("auto")
    with LoadGenerator(res.base_url, "auto", clients=2, max_tokens=32, timeout_s=60) as load:
        load.wait_for(4)
        child(victim.pid, "EngineCore").kill()
        killed_at = time.monotonic()
        until(lambda: replica_ids(res, "auto") - {victim.replica_id}, "Serve replaces the replica", timeout_s=300)
        load.wait_for(4)  # new requests succeed
    assert_clean(load.failures)
    late = [f for f in load.failed if f.ended - f.started > 60]
    assert not late, late  # nobody hung past the deadline
    print(f"{len(load.failed)} requests failed cleanly after the kill at {killed_at:.0f}; {load.ok} succeeded")


def test_a_hung_engine_core_is_killed_and_its_replica_replaced(res):
    assert_hung_engine_replaced(res, "auto", lambda pid: child(pid, "EngineCore"), clients=2, limit_s=8,
                                replace_s=300)


def test_the_node_port_serves_the_llama_engines_own_series_for_its_model(res):
    text = httpx.get(f"http://127.0.0.1:{res.metrics_port}/metrics", timeout=10).text
    served = [line for line in text.splitlines() if line.startswith('llamacpp:prompt_tokens_total{model="pair"')]
    assert served and sum(float(line.rsplit(" ", 1)[1]) for line in served) > 0, served
    assert 'mship_worker_requests_total{model="pair",outcome="finished"}' in text
