"""The deploy lifecycle on the session's long-lived platform (its gateways are never restarted, as
in production), with clients hammering the gateway throughout: blue-green cutover, rescale in
place, a cancelled scale-up, a failing version, one load at a time per node, hot reconcile; then
Redis-backed self-heal on a platform of its own.

The tests of this module build on each other in order (the model `swap` evolves); the module's
fixture puts the session's model set back at the end.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from mship.coordinator.v1 import coordinator_pb2 as cpb
from tests.helpers import until_sync as until
from tests.integration.conftest import PLATFORM_MODELS
from tests.load_generator import LoadGenerator
from tests.platform_process import PlatformProcess, mship
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


def swap_models(max_model_len: int = 512, replicas: int = 1, model: str = "builtin:tiny-qwen2") -> str:
    return (f"models:\n  - name: swap\n    model: {model}\n    max_model_len: {max_model_len}\n"
            f"    max_num_seqs: 4\n    num_cpus: 0.5\n    num_replicas: {replicas}\n")


V1, V2 = 512, 768  # max_model_len is reload-relevant: changing it makes a new version


@pytest.fixture(scope="module")
def home(platform: PlatformProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("lifecycle")
    yield home
    (home / "session.yaml").write_text(PLATFORM_MODELS)  # back to the session's set, for later modules
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(home / "session.yaml"),
                "--reconcile", "--wait")
    assert out.returncode == 0, out.stdout + out.stderr


def deploy(platform: PlatformProcess, home: Path, models: str, *flags: str) -> tuple[int, str]:
    config = home / f"models-{time.monotonic_ns()}.yaml"
    config.write_text(models)
    out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(config), *flags)
    return out.returncode, out.stdout + out.stderr


def app_of(platform: PlatformProcess, model: str) -> str:
    (info,) = [m for m in platform.models().models if m.spec.name == model]
    return info.app_name


def apps(platform: PlatformProcess) -> dict[str, cpb.ServeApp]:
    return {a.name: a for a in platform.models().apps}


def processes_of(platform: PlatformProcess, app: str) -> list[psutil.Process]:
    """The app's replica actors and everything they started (the vLLM engine core)."""
    replicas = platform.find(app)
    return replicas + [c for p in replicas for c in p.children(recursive=True)]


def gone(procs: list[psutil.Process]) -> bool:
    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in procs)


def test_blue_green_cutover_under_load(platform, home):
    code, out = deploy(platform, home, swap_models(V1), "--wait")
    assert code == 0, out
    old_app = app_of(platform, "swap")
    old_procs = processes_of(platform, old_app)
    assert len(old_procs) >= 2, "expected the replica and its engine process"
    with LoadGenerator(platform.base_url, "swap", clients=4, headers=platform.headers) as load:
        load.wait_for(8)
        code, out = deploy(platform, home, swap_models(V2), "--wait")
        load.wait_for(8)  # the new version serves the same clients
    assert code == 0, out
    assert load.failures == []
    new_app = app_of(platform, "swap")
    assert new_app != old_app
    running = apps(platform)
    assert old_app not in running and running[new_app].status == "RUNNING"  # Serve's own view
    until(lambda: gone(old_procs), "the old version's replica and engine processes exit", 30)


def test_rescale_in_place_and_a_cancelled_scale_up(platform, home):
    (original,) = platform.replicas("swap")
    started = psutil.Process(original.pid).create_time()
    app = app_of(platform, "swap")
    with LoadGenerator(platform.base_url, "swap", clients=4, headers=platform.headers) as load:
        load.wait_for(4)
        code, out = deploy(platform, home, swap_models(V2, replicas=2), "--wait")
        assert code == 0, out
        ids = {r.replica_id for r in platform.replicas("swap")}
        assert len(ids) == 2 and original.replica_id in ids
        load.wait_for(4)
        code, out = deploy(platform, home, swap_models(V2, replicas=1), "--wait")
        assert code == 0, out
        until(lambda: [r.replica_id for r in platform.replicas("swap")] == [original.replica_id], "back to one")
        load.wait_for(4)

        # A scale-up cancelled while its replicas load goes back to the committed count.
        code, out = deploy(platform, home, swap_models(V2, replicas=3))
        assert code == 0, out
        deploy_id = re.search(r"deploy (\w+) started", out).group(1)
        until(lambda: apps(platform)[app].target_replicas == 3, "the scale-up is under way")
        # One deploy at a time: another one waits its turn, and says so.
        code, out = deploy(platform, home, swap_models(V2, replicas=1))
        assert code == 0 and f"queued behind deploy {deploy_id}" in out, out
        queued_id = re.search(r"deploy (\w+) started", out).group(1)
        assert platform.deployment(queued_id).state == cpb.DEPLOY_STATE_QUEUED
        cancelled = mship("--coordinator", platform.coordinator, "deploy", "--cancel", deploy_id)
        assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled.stdout + cancelled.stderr
        assert platform.deployment(deploy_id).state == cpb.DEPLOY_STATE_CANCELLED
        until(lambda: platform.deployment(queued_id).state == cpb.DEPLOY_STATE_SUCCEEDED, "the queued deploy ran")
        until(lambda: (apps(platform)[app].target_replicas, apps(platform)[app].running_replicas) == (1, 1),
              "the committed count of 1", 60)
        load.wait_for(4)
    assert load.failures == []
    assert app_of(platform, "swap") == app  # never reloaded: same app, same replica, same process
    assert [r.replica_id for r in platform.replicas("swap")] == [original.replica_id]
    assert psutil.Process(original.pid).create_time() == started
    (committed,) = [m for m in platform.committed() if m.name == "swap"]
    assert committed.num_replicas == 1


def test_a_failing_version_rolls_back_and_the_old_one_serves(platform, home):
    committed_before = platform.committed()
    app = app_of(platform, "swap")
    with LoadGenerator(platform.base_url, "swap", clients=4, headers=platform.headers) as load:
        load.wait_for(4)
        code, out = deploy(platform, home, swap_models(V2, model="/nonexistent/mship-model"), "--wait")
        load.wait_for(4)
    assert code == 4, out  # EXIT_DEPLOY_FAILED
    assert re.search(r"swap\s+failed", out) and "/nonexistent/mship-model" in out, out  # the model and the reason
    assert load.failures == []
    assert platform.committed() == committed_before
    assert app_of(platform, "swap") == app
    assert [name for name in apps(platform) if "swap" in name] == [app]  # the failed version is torn down


def test_hot_reconcile_and_one_load_at_a_time_per_node(platform, home):
    pair = "  - name: pair\n    model: builtin:tiny-qwen2\n    max_model_len: 512\n    num_cpus: 0.5\n" \
           "    num_replicas: 2\n"
    code, out = deploy(platform, home, PLATFORM_MODELS + pair, "--reconcile", "--wait")
    assert code == 0, out
    assert sorted(m.spec.name for m in platform.models().models) == ["pair", "tiny"]
    assert not [name for name in apps(platform) if "swap" in name]
    body = {"model": "swap", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{platform.base_url}/v1/chat/completions", json=body, timeout=60,
                      headers=platform.headers).status_code == 404
    # Both replicas of `pair` loaded on this one node: their lease windows never overlap.
    holders = {r.replica_id for r in platform.replicas("pair")}
    assert len(holders) == 2
    windows = sorted((r for r in platform.leases() if r.holder in holders), key=lambda r: r.granted_at)
    assert [r.end for r in windows] == [cpb.LEASE_END_RELEASED] * 2
    assert windows[0].ended_at <= windows[1].granted_at
    r = httpx.post(f"{platform.base_url}/v1/chat/completions", json={**body, "model": "pair"}, timeout=60,
                   headers=platform.headers)
    assert r.status_code == 200


def test_redis_backed_self_heal(redis_store: RedisServer, tmp_path):
    """Stop everything; `mship start` with no config brings back the committed set from Redis."""
    store = redis_store.url.rsplit("/", 1)[0] + "/1"  # a database of its own
    config = tmp_path / "models.yaml"
    config.write_text("models:\n  - name: healed\n    model: builtin:tiny-qwen2\n    max_model_len: 512\n"
                      "    num_cpus: 0.5\n")
    body = {"model": "healed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    first = PlatformProcess.start(config, tmp_path / "first.log", gateway_replicas=1, state_store=store)
    try:
        first.wait_ready()
        assert httpx.post(f"{first.base_url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    finally:
        first.stop()
    second = PlatformProcess.start(None, tmp_path / "second.log", gateway_replicas=1, state_store=store)
    try:
        second.wait_ready()
        assert [m.name for m in second.committed()] == ["healed"]
        r = httpx.post(f"{second.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        second.stop()
