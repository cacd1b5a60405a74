"""GCS fault tolerance as KubeRay sets it up on the head, on real parts: a password-protected Redis,
`mship start --no-models-on-head` with RAY_REDIS_ADDRESS, REDIS_PASSWORD and
RAY_external_storage_namespace in its environment. Ray's GCS keeps its tables in that Redis under
the namespace, and Ray's agent answers the chart's health probe on the port given; a wrong password
fails the start at once (exit 5) with a message naming the variables.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import pytest
import redis

from services.common.vocabulary import (
    ENV_GCS_REDIS_ADDRESS,
    ENV_GCS_REDIS_PASSWORD,
    ENV_GCS_STORAGE_NAMESPACE,
    GATEWAY_RESOURCE,
)
from tests.platform_process import PlatformProcess, free_port, mship
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
START_TIMEOUT_S = 240  # a platform with no models is up in ~15-20 s; more on a busy 2-core box
PASSWORD = "gcs-" + secrets.token_hex(8)


@pytest.fixture
def gcs_redis(tmp_path: Path):
    server = RedisServer(tmp_path, password=PASSWORD)
    try:
        yield server
    finally:
        server.stop()


def gcs_env(server: RedisServer, password: str, namespace: str) -> dict[str, str]:
    return {ENV_GCS_REDIS_ADDRESS: f"127.0.0.1:{server.port}", ENV_GCS_REDIS_PASSWORD: password,
            ENV_GCS_STORAGE_NAMESPACE: namespace, "HF_HUB_OFFLINE": "1"}


def test_the_head_keeps_the_gcs_tables_in_redis_and_stops_cleanly(gcs_redis, tmp_path):
    namespace = "mship-ft-" + secrets.token_hex(4)
    agent_port = free_port()
    platform = PlatformProcess.start(None, tmp_path / "head.log", gateway_replicas=1,
                                     env=gcs_env(gcs_redis, PASSWORD, namespace),
                                     extra=("--no-models-on-head", "--node-num-cpus", "3",
                                            "--dashboard-agent-port", str(agent_port)))
    try:
        platform.wait_ready(START_TIMEOUT_S)
        assert "mship platform up in" in platform.tail(200)
        client = redis.Redis(host="127.0.0.1", port=gcs_redis.port, password=PASSWORD)
        keys = {k.decode() for k in client.scan_iter(match=f"*{namespace}*")}
        # Ray's GCS tables, one hash each: RAY<namespace>@<TABLE>
        tables = {k.split("@", 1)[1] for k in keys if k.startswith(f"RAY{namespace}@")}
        assert {"NODE", "KV", "ACTOR", "JOB"} <= tables, keys
        assert client.hlen(f"RAY{namespace}@ACTOR") >= 4  # Serve's controller, state, coordinator, a gateway
        client.close()
        (head,) = platform.cluster_status().nodes
        assert head.is_head and list(head.capabilities) == []
        assert head.resources["CPU"] == 3.0 and head.resources[GATEWAY_RESOURCE] == 1000.0
        assert PASSWORD not in platform.tail(400)
        # the Helm chart's start-up and liveness probe: Ray's agent on the port given, raylet and GCS
        health = httpx.get(f"http://127.0.0.1:{agent_port}/api/healthz", timeout=10)
        assert health.status_code == 200 and "raylet: success" in health.text and "gcs: success" in health.text, \
            health.text
    finally:
        took = platform.stop(timeout_s=90)
    assert platform.proc.returncode == 0 and took < 60, platform.tail()


def test_a_wrong_redis_password_fails_the_start_at_once(gcs_redis, tmp_path):
    t0 = time.monotonic()
    ports = [str(free_port()) for _ in range(4)]
    out = mship("start", "--no-models-on-head", "--no-metrics", "--http-port", ports[0], "--coordinator-port",
                ports[1], "--state-port", ports[2], "--gcs-port", ports[3], timeout_s=120,
                env=gcs_env(gcs_redis, "not-the-password", "mship-ft-wrong"))
    took = time.monotonic() - t0
    assert out.returncode == 5, out.stdout + out.stderr
    assert "failed to start" in out.stderr and "WRONGPASS" in out.stderr, out.stderr
    assert ENV_GCS_REDIS_ADDRESS in out.stderr and ENV_GCS_REDIS_PASSWORD in out.stderr
    assert "not-the-password" not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert took < 60, out.stderr
