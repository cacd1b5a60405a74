"""After a coordinator restart: take over the platform that is still running.

Serve's model apps outlive the coordinator, and their replicas re-register with the new one. It
waits (briefly) until every app that runs replicas has one back, then adopts each model's running
version with the committed spec (a rescale or new limits made in place since its replicas started
are in the committed spec, not in theirs). Where two versions of a model run (a cutover interrupted
by the restart), the committed one; a committed app with no replica (scaled to zero, or still
loading) is adopted too. Model apps neither adopted nor committed are orphans of a deploy the
restart ended: `recover` returns them to be deleted. Without a committed set to go by (none stored,
or the state service is down), only what has replicas is adopted and nothing is deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import grpc

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deployer import Deployer
from services.coordinator.fingerprint import app_name, version_of
from services.coordinator.planner import RunningModel
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.serve_control import AppState, ServeControl

log = logging.getLogger(__name__)
Committed = Callable[[], Awaitable[list[common_pb2.ModelSpec] | None]]


async def take_over(registry: ReplicaRegistry, deployer: Deployer, serve: ServeControl, committed: Committed,
                    expected: Sequence[str], wait_s: float, ready: Callable[[], Awaitable[None]]) -> None:
    """A restarted coordinator's start, the deploys held back throughout: adopt what runs, expect
    the committed models (and `expected`), open routing (`ready`), then delete the orphans."""
    async with deployer.exclusive("the coordinator's recovery after its restart; it runs once that is done"):
        orphans = await recover(registry, deployer, serve, committed, wait_s)
        try:  # the committed set comes back (the start's self-heal deploy, or the platform's own models)
            names = [s.name for s in await committed() or []]
        except grpc.aio.AioRpcError:
            names = []
        await registry.expect([*names, *expected])
        await ready()
        for app in orphans:  # unrouted: nothing to drain
            log.warning("deleting %s: a model version neither routed nor committed (its deploy ended with "
                        "the coordinator's restart)", app)
            try:
                await serve.delete(app)
            except Exception:  # left running, unrouted; the coordinator serves on
                log.exception("deleting the orphaned %s failed", app)


async def recover(registry: ReplicaRegistry, deployer: Deployer, serve: ServeControl, committed: Committed,
                  wait_s: float) -> list[str]:
    """Adopt the running model apps once their replicas re-registered (or `wait_s` passed); the
    orphaned apps (to delete). Run it with the deploys held back (`Deployer.exclusive`)."""
    apps = await serve.model_apps()
    if not apps:
        return []
    deadline = time.monotonic() + wait_s
    while not {name for name, app in apps.items() if app.target_replicas > 0} <= registered_apps(registry):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not await registry.wait_newer(registry.version, remaining):
            break  # some app has no live replica: route what re-registered
    try:
        committed_set = await committed()
    except grpc.aio.AioRpcError:  # no state service: adopt what runs
        committed_set = None
    apps = await serve.model_apps()  # as they are now, after the wait
    models = adoptable([r.info for r in registry.replicas.values()], apps, committed_set or [])
    await deployer.adopt(models)
    if committed_set is None:
        return []
    return sorted(set(apps) - {m.app for m in models.values()})


def registered_apps(registry: ReplicaRegistry) -> set[str]:
    return {app_name(r.info.spec, r.info.version) for r in registry.replicas.values()}


def adoptable(replicas: list[pb.ReplicaInfo], apps: Mapping[str, AppState],
              committed: list[common_pb2.ModelSpec]) -> dict[str, RunningModel]:
    """Model name -> its running version, from the replicas of apps that Serve still runs, and the
    committed apps Serve runs without a replica."""
    committed_specs = {spec.name: (spec, version_of(spec)) for spec in committed}
    out: dict[str, RunningModel] = {}
    for info in replicas:
        app = app_name(info.spec, info.version)
        if app not in apps:
            continue
        spec, version = committed_specs.get(info.model, (info.spec, ""))
        if version == info.version:
            out[info.model] = RunningModel(spec, info.version, app)
        elif info.model not in out:
            out[info.model] = RunningModel(info.spec, info.version, app)
    for name, (spec, version) in committed_specs.items():
        if name not in out and app_name(spec, version) in apps:
            out[name] = RunningModel(spec, version, app_name(spec, version))
    return out
