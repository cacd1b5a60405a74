"""`ServeControl` in memory, and the real Deployer wired to it (`DeployRig`), for tests that run
deploys in milliseconds.

An app comes up as soon as it is submitted and its replicas register with the replica registry, as
real workers would; a test makes a model fail to load (`fail`), or holds its replicas back (`hold`,
then `release`) to catch a deploy mid-load. `heartbeat_forever` stands for the workers' heartbeats
(each reports the in-flight calls a test set in `inflight`). Every Serve call is recorded in `calls`.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.common.vocabulary import capability_resource
from services.coordinator.deploy_log import KEEP_FINISHED, DeployRecord
from services.coordinator.deployer import Deployer
from services.coordinator.placement import unhostable
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.serve_control import AppState, ModelApps, NodeState


@dataclass
class FakeApp:
    spec: common_pb2.ModelSpec
    version: str
    target: int
    status: str = "DEPLOYING"
    message: str = ""
    replica_ids: list[str] = field(default_factory=list)


def model_spec(name: str, max_model_len: int = 512, replicas: int = 1, autoscaled: bool = False,
               model: str = "builtin:tiny-qwen2") -> common_pb2.ModelSpec:
    """A model to deploy: `max_model_len` (reload-relevant) picks its version, the rest its scale."""
    out = common_pb2.ModelSpec(name=name, model=model, max_model_len=max_model_len,
                               num_replicas=0 if autoscaled else replicas)
    if autoscaled:
        out.autoscaling.CopyFrom(common_pb2.AutoscalingConfig(min_replicas=1, max_replicas=3))
    return out


def initial_replicas(spec: common_pb2.ModelSpec) -> int:
    return max(1, spec.autoscaling.min_replicas) if spec.HasField("autoscaling") else spec.num_replicas


class FakeServe:
    def __init__(self, registry: ReplicaRegistry) -> None:
        self.registry = registry
        self.apps: dict[str, FakeApp] = {}
        self.calls: list[tuple[object, ...]] = []
        self.failing: dict[str, str] = {}  # ModelSpec.model -> the message Serve reports
        self.held: set[str] = set()        # model names whose replicas do not come up yet
        self.inflight: dict[str, int] = {}  # replica id -> in-flight calls its heartbeats report
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        # One head that runs vLLM; a test sets what the cluster can host.
        self.node_list = [NodeState("node-head", "head", "127.0.0.1", True, True,
                                    {"CPU": 8.0, capability_resource("vllm"): 1000.0})]

    # ---- ServeControl ------------------------------------------------------------------------
    async def model_apps(self) -> dict[str, AppState]:
        return {name: AppState(a.status, a.message, len(a.replica_ids), a.target) for name, a in self.apps.items()}

    async def submit(self, apps: ModelApps, coordinator: str) -> None:
        self.calls.append(("submit", *sorted(apps)))
        for name, (spec, version) in apps.items():
            self.apps[name] = FakeApp(spec, version, initial_replicas(spec))
            await self._converge(name)

    async def rescale(self, name: str, replicas: int) -> None:
        self.calls.append(("rescale", name, replicas))
        self.apps[name].target = replicas
        await self._converge(name)

    async def delete(self, name: str) -> None:
        self.calls.append(("delete", name))
        app = self.apps.pop(name, None)
        for replica_id in app.replica_ids if app else []:
            await self.registry.unregister(replica_id)
        self._notify()

    async def nodes(self) -> list[NodeState]:
        return list(self.node_list)

    async def wake(self, name: str) -> None:
        self.calls.append(("wake", name))
        self.apps[name].target = max(1, self.apps[name].target)
        await self._converge(name)

    async def wait_app(self, name: str, timeout_s: float) -> AppState:
        async def settled() -> None:
            while name in self.apps and self.apps[name].status == "DEPLOYING":
                wake = self._wake
                await wake.wait()
        try:
            await asyncio.wait_for(settled(), timeout_s)
        except TimeoutError:
            return AppState("DEPLOY_FAILED", f"not ready within {timeout_s:.0f}s", 0)
        app = self.apps.get(name)
        if app is None:
            return AppState("DEPLOY_FAILED", "the application disappeared", 0)
        return AppState(app.status, app.message, len(app.replica_ids), app.target)

    # ---- what a test does to Serve -----------------------------------------------------------
    def fail(self, model: str, message: str) -> None:
        """Apps of ModelSpec.model `model` fail to start with Serve's `message`."""
        self.failing[model] = message

    def hold(self, name: str) -> None:
        self.held.add(name)

    async def release(self, name: str) -> None:
        self.held.discard(name)
        for app in [a for a, fake in self.apps.items() if fake.spec.name == name]:
            await self._converge(app)

    async def drift(self, app: str, replicas: int) -> None:
        """Serve runs another count than the coordinator set (an operator, a controller restart)."""
        self.apps[app].target = replicas
        await self._converge(app)

    async def join(self, node: NodeState) -> None:
        """A node joins: what waited for its resources starts (as Ray places a pending replica)."""
        self.node_list.append(node)
        for app in list(self.apps):
            await self._converge(app)

    def app_of(self, name: str) -> list[str]:
        return sorted(a for a, fake in self.apps.items() if fake.spec.name == name)

    async def heartbeat_forever(self, interval_s: float = 0.005) -> None:
        while True:
            for replica_id in list(self.registry.replicas):
                await self.registry.heartbeat(pb.HeartbeatRequest(
                    replica_id=replica_id, inflight_calls=self.inflight.get(replica_id, 0)))
            await asyncio.sleep(interval_s)

    # ---- inside -------------------------------------------------------------------------------
    async def _converge(self, name: str) -> None:
        app = self.apps[name]
        if app.spec.model in self.failing:
            app.status, app.message = "DEPLOY_FAILED", self.failing[app.spec.model]
        elif app.spec.name not in self.held and unhostable(app.spec, self.node_list) is None:
            while len(app.replica_ids) > app.target:
                await self.registry.unregister(app.replica_ids.pop())
            while len(app.replica_ids) < app.target:
                replica_id = f"{name}-r{next(self._ids)}"
                app.replica_ids.append(replica_id)
                await self.registry.register(pb.ReplicaInfo(
                    replica_id=replica_id, model=app.spec.name, version=app.version, spec=app.spec,
                    endpoint=common_pb2.Endpoint(host="127.0.0.1", port=1)))
            app.status = "RUNNING"
        self._notify()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()


class DeployRig:
    """The real Deployer over a fake Serve and a real replica registry, committing to a list."""

    def __init__(self, load_timeout_s: float = 5.0, keep_finished: int = KEEP_FINISHED) -> None:
        self.registry = ReplicaRegistry()
        self.serve = FakeServe(self.registry)
        self.commits: list[list[common_pb2.ModelSpec]] = []
        self.commit_error: Exception | None = None  # the state service refuses the write
        self.deployer = Deployer(self.registry, self.serve, "127.0.0.1:1", commit=self._commit,
                                 committed=self._committed, load_timeout_s=load_timeout_s,
                                 keep_finished=keep_finished, drain_poll_s=0.002)
        self._heartbeats: asyncio.Task | None = None

    async def __aenter__(self) -> DeployRig:
        self._heartbeats = asyncio.create_task(self.serve.heartbeat_forever())
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = [r.task for r in self.deployer.records.in_flight() if r.task] + [self._heartbeats]
        for task in tasks:
            task.cancel()  # type: ignore[union-attr]
        await asyncio.wait(tasks)  # type: ignore[arg-type]

    def start(self, *specs: common_pb2.ModelSpec, reconcile: bool = False, **fields: object) -> DeployRecord:
        mode = pb.DEPLOY_MODE_RECONCILE if reconcile else pb.DEPLOY_MODE_ADDITIVE
        return self.deployer.start(pb.DeployRequest(models=specs, mode=mode, **fields))

    async def deploy(self, *specs: common_pb2.ModelSpec, reconcile: bool = False, **fields: object) -> DeployRecord:
        """Run a deploy to its end."""
        record = self.start(*specs, reconcile=reconcile, **fields)
        await asyncio.wait({record.task})  # type: ignore[arg-type]
        return record

    def route(self, name: str) -> str | None:
        """The version `name` routes to."""
        active = self.registry.active.get(name)
        return active.version if active else None

    async def _commit(self, models: list[common_pb2.ModelSpec], deploy_id: str) -> None:
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append(list(models))

    async def _committed(self) -> list[common_pb2.ModelSpec] | None:
        return self.commits[-1] if self.commits else None  # none stored yet


def phases(record: DeployRecord) -> dict[str, int]:
    return {name: progress.phase for name, progress in record.models.items()}


def messages(record: DeployRecord) -> list[str]:
    return [event.message for event in record.events.events]
