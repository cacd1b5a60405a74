"""The stop is bounded on real parts: `mship start` with no models (Ray head, Serve, state,
coordinator, a gateway) stops on SIGTERM within its --stop-timeout, with rc 0 and none of its
processes left, also when the SIGTERM comes while it connects to Ray; `mship stop` returns, and a
gateway that cannot drain (a request whose body never arrives) is killed at the deadline and named."""

from __future__ import annotations

import socket
import time

import pytest

from services.cluster.shutdown import alive
from tests.helpers import until_sync
from tests.platform_process import PlatformProcess, mship

pytestmark = pytest.mark.integration
START_TIMEOUT_S = 240  # a platform with no models is up in ~15-20 s; more on a busy 2-core box


def _platform(tmp_path, name: str, stop_timeout_s: float) -> PlatformProcess:
    platform = PlatformProcess.start(None, tmp_path / f"{name}.log", gateway_replicas=1,
                                     extra=("--stop-timeout", str(stop_timeout_s)))
    try:
        platform.wait_ready(START_TIMEOUT_S)
    except BaseException:
        platform.stop()
        raise
    assert platform.find("GatewayDeployment") and platform.find("CoordinatorDeployment")
    return platform


def test_sigterm_stops_the_platform_within_its_stop_timeout_and_leaves_nothing(tmp_path):
    stop_timeout = 30.0
    platform = _platform(tmp_path, "sigterm", stop_timeout)
    started = platform.descendants()
    took = platform.stop(timeout_s=stop_timeout + 30)  # SIGKILLs only past that (and rc is then -9)
    log = platform.tail(200)
    assert platform.proc.returncode == 0 and took < stop_timeout, log
    assert "stop forced" not in log  # nothing to force: every replica drained in time
    assert [p.pid for p in started if alive(p)] == [], log


def test_sigterm_while_the_start_connects_to_ray_stops_it_cleanly(tmp_path):
    """Inside ray.init Ray's C++ signal handler sits in front (it aborted the process 3 s after a
    SIGTERM) and an interrupted ray.init leaves a driver whose exit hook crashed (SIGSEGV)."""
    platform = PlatformProcess.start(None, tmp_path / "early.log", gateway_replicas=1)
    try:
        until_sync(lambda: "Connected to Ray cluster" in platform.tail(), "the start inside ray.init",
                   timeout_s=START_TIMEOUT_S, poll_s=0.02)
        started = platform.descendants()
    finally:
        took = platform.stop(timeout_s=90)
    assert platform.proc.returncode == 0 and took < 30, platform.tail()
    assert [p.pid for p in started if alive(p)] == [], platform.tail()


def test_mship_stop_returns_and_a_gateway_that_cannot_drain_is_killed_at_the_deadline(tmp_path):
    stop_timeout = 12.0  # the gateway's own drain would take 22 s (2 s + uvicorn's 20 s for the request)
    platform = _platform(tmp_path, "forced", stop_timeout)
    started = platform.descendants()
    # A request whose body never comes: the gateway holds it in flight until uvicorn gives up on it.
    # `Expect: 100-continue` makes the gateway say when its handler waits for the body.
    held = socket.create_connection(("127.0.0.1", platform.http_port), timeout=30)
    try:
        held.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: 100\r\n\r\n")
        assert held.recv(64).startswith(b"HTTP/1.1 100 Continue")
        t0 = time.monotonic()
        out = mship("stop", "--coordinator", platform.coordinator, timeout_s=stop_timeout + 60)
        took = time.monotonic() - t0
    finally:
        held.close()
    log = platform.tail(200)
    assert out.returncode == 0 and "mship stopped" in out.stdout, out.stdout + out.stderr + log
    assert platform.proc.wait(10) == 0 and took < stop_timeout + 5, log
    forced = [line for line in log.splitlines() if "stop forced after" in line]
    assert len(forced) == 1 and "(the 12s stop timeout)" in forced[0], log
    assert "killed 1 replica actor (mship-gateway#GatewayDeployment#" in forced[0], log
    assert [p.pid for p in started if alive(p)] == [], log
