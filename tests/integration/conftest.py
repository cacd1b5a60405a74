"""Session fixtures: one real vLLM worker (builtin:tiny-qwen2) in its own process, and one real platform
(`mship start`: Ray, Serve, coordinator, state, two gateway replicas, a tiny-qwen2 worker deployment)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from mship.worker.v1 import worker_pb2_grpc
from services.common.vocabulary import (
    ENV_API_KEYS_FILE,
    ENV_LOG_FORMAT,
    ENV_LOG_LEVEL,
    ENV_MCP_ALLOWED_HOSTS,
    ENV_RATE_LIMITS_FILE,
)
from tests.otlp_receiver import OtlpReceiver
from tests.platform_process import PlatformProcess
from tests.redis_server import RedisServer
from tests.syslog_listener import SyslogListener
from tests.worker_process import WorkerProcess

TINY = "tiny"
# The session platform's API keys (MSHIP_API_KEYS_FILE): key -> identity. Every client of it sends one.
DEFAULT_KEY = "test-key"
SESSION_KEYS = {DEFAULT_KEY: "tests", "key-tenant-a": "tenant-a", "key-tenant-b": "tenant-b",
                "key-loaders": "loaders", "key-fuzz": "fuzz", "key-limits": "limits", "key-tokens": "tokens",
                "key-cache-a": "cache-a", "key-cache-b": "cache-b"}
# Two engine slots: a third request queues, which lets a test cancel a request before its first
# token deterministically.
MAX_NUM_SEQS = 2


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from services.worker.builtin import resolve_model_ref
    return resolve_model_ref("builtin:tiny-qwen2")


@pytest.fixture(scope="session")
def worker(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    log = Path(tmp_path_factory.mktemp("worker")) / "worker.log"
    proc = WorkerProcess.start("builtin:tiny-qwen2", log, name=TINY,
                               extra=["--max-model-len", "1024", "--max-num-seqs", str(MAX_NUM_SEQS)])
    try:
        proc.wait_serving()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def stub(worker: WorkerProcess) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    async with grpc.aio.insecure_channel(worker.address) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


PLATFORM_MODELS = """\
models:
  - name: tiny
    model: builtin:tiny-qwen2
    max_model_len: 1024
    max_num_seqs: 2
    num_cpus: 0.5
"""


@pytest.fixture(scope="session")
def redis_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def syslog() -> Iterator[SyslogListener]:
    listener = SyslogListener()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpReceiver]:
    """The session platform's trace collector (`--otel-endpoint`)."""
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture(scope="session")
def platform(tiny_model: str, redis_store: RedisServer, syslog: SyslogListener, otlp: OtlpReceiver,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformProcess]:
    """`mship start` with two gateway replicas, builtin:tiny-qwen2 as `tiny`, state in Redis, API keys
    from a file and rate-limit overrides from another (`home/rate-limits.yaml`, re-read on change),
    JSON logs at DEBUG sent to the session's syslog listener, traces to its OTLP receiver, metrics on
    a port of its own."""
    home = Path(tmp_path_factory.mktemp("platform"))
    config = home / "models.yaml"
    config.write_text(PLATFORM_MODELS)
    keys, limits = home / "api-keys", home / "rate-limits.yaml"
    keys.write_text("".join(f"{key}:{identity}\n" for key, identity in SESSION_KEYS.items()))
    limits.write_text("{}\n")
    proc = PlatformProcess.start(config, home / "mship.log", gateway_replicas=2, state_store=redis_store.url,
                                 env={ENV_API_KEYS_FILE: str(keys), ENV_RATE_LIMITS_FILE: str(limits),
                                      ENV_LOG_FORMAT: "json", ENV_LOG_LEVEL: "DEBUG",
                                      ENV_MCP_ALLOWED_HOSTS: "127.0.0.1"},  # test_mcp_loop's servers
                                 extra=("--log-target", syslog.target, "--otel-endpoint", otlp.endpoint))
    proc.api_key = DEFAULT_KEY
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
