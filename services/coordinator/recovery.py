"""After a coordinator restart: take over the platform that is still running.

Serve's model apps outlive the coordinator, and their replicas re-register with the new one. It
waits (briefly) until every app has a replica back, then adopts each model's running version —
where two versions of a model run (a cutover interrupted by the restart), the committed one.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

import grpc

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deployer import Deployer
from services.coordinator.fingerprint import app_name, version_of
from services.coordinator.planner import RunningModel
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.serve_control import AppState, ServeControl


async def recover(registry: ReplicaRegistry, deployer: Deployer, serve: ServeControl,
                  committed: Callable[[], Awaitable[list[common_pb2.ModelSpec]]], wait_s: float) -> None:
    """Adopt the running model apps once their replicas re-registered (or `wait_s` passed)."""
    apps = await serve.model_apps()
    if not apps:
        return
    deadline = time.monotonic() + wait_s
    while len({r.info.version for r in registry.replicas.values()}) < len(apps):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not await registry.wait_newer(registry.version, remaining):
            break  # some app has no live replica: route what re-registered
    try:
        committed_set = await committed()
    except grpc.aio.AioRpcError:  # no state service: adopt what runs
        committed_set = []
    await deployer.adopt(adoptable([r.info for r in registry.replicas.values()], apps, committed_set))


def adoptable(replicas: list[pb.ReplicaInfo], apps: Mapping[str, AppState],
              committed: list[common_pb2.ModelSpec]) -> dict[str, RunningModel]:
    """Model name -> its running version, from the replicas of apps that Serve still runs."""
    committed_versions = {spec.name: version_of(spec) for spec in committed}
    out: dict[str, RunningModel] = {}
    for info in replicas:
        app = app_name(info.spec, info.version)
        if app not in apps:
            continue
        if info.model not in out or committed_versions.get(info.model) == info.version:
            out[info.model] = RunningModel(info.spec, info.version, app)
    return out
