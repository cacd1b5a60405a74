"""Apply a model set: additive or reconcile, one deploy at a time, progress as a stream of events.

Per model: same version -> unchanged (or rescaled in place when only the scale differs); a new
name -> a new Serve app; a changed version -> the new app loads beside the old one, the route
switches once it is ready, then the old app is deleted; a failed new version is deleted and the
old one keeps serving. The committed set is written to the state service only when every model
of the deploy succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator import serve_control
from services.coordinator.fingerprint import app_name, version_of
from services.coordinator.routing import ActiveModel, RoutingTable

log = logging.getLogger(__name__)
Phase = pb.ModelPhase
TERMINAL = (pb.DEPLOY_STATE_SUCCEEDED, pb.DEPLOY_STATE_FAILED, pb.DEPLOY_STATE_CANCELLED)
DEFAULT_LOAD_TIMEOUT_S = 900.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass
class RunningModel:
    spec: common_pb2.ModelSpec
    version: str
    app: str
    load_time_s: float = 0.0


@dataclass
class DeployRecord:
    deploy_id: str
    models: dict[str, pb.ModelProgress] = field(default_factory=dict)
    state: int = pb.DEPLOY_STATE_QUEUED
    error: str = ""
    started_at: float = field(default_factory=time.time)
    finished_at: float = 0.0
    events: list[pb.DeployEvent] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    task: asyncio.Task | None = None

    async def emit(self, message: str = "", model: pb.ModelProgress | None = None, state: int | None = None) -> None:
        async with self.changed:
            if state is not None:
                self.state = state
                if state in TERMINAL:
                    self.finished_at = time.time()
            if model is not None:
                self.models[model.name] = model
            event = pb.DeployEvent(deploy_id=self.deploy_id, state=self.state, message=message)
            if model is not None:
                event.model.CopyFrom(model)
            self.events.append(event)
            self.changed.notify_all()

    async def follow(self) -> AsyncIterator[pb.DeployEvent]:
        seen = 0
        while True:
            async with self.changed:
                await self.changed.wait_for(lambda n=seen: len(self.events) > n)
                new = self.events[seen:]
            seen += len(new)
            for event in new:
                yield event
            if self.state in TERMINAL and seen == len(self.events):
                return

    def to_proto(self) -> pb.Deployment:
        return pb.Deployment(deploy_id=self.deploy_id, state=self.state, models=list(self.models.values()),
                             error=self.error, started_at=self.started_at, finished_at=self.finished_at)


@dataclass
class Plan:
    add: dict[str, tuple[common_pb2.ModelSpec, str]] = field(default_factory=dict)  # name -> (spec, version)
    rescale: dict[str, common_pb2.ModelSpec] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S


class Deployer:
    def __init__(self, table: RoutingTable, coordinator_address: str,
                 commit: Callable[[list[common_pb2.ModelSpec], str], Awaitable[None]] | None = None,
                 committed: Callable[[], Awaitable[list[common_pb2.ModelSpec]]] | None = None,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> None:
        self.table = table
        self.coordinator_address = coordinator_address
        self.running: dict[str, RunningModel] = {}
        self.records: dict[str, DeployRecord] = {}
        self.latest = ""
        self._commit = commit
        self._committed = committed
        self._load_timeout_s = load_timeout_s
        self._one_at_a_time = asyncio.Lock()

    def start(self, request: pb.DeployRequest) -> DeployRecord:
        record = DeployRecord(deploy_id=uuid.uuid4().hex[:12])
        self.records[record.deploy_id] = record
        self.latest = record.deploy_id
        record.task = asyncio.create_task(self._run(record, request))
        return record

    def plan(self, request: pb.DeployRequest) -> Plan:
        plan = Plan(drain_timeout_s=request.drain_timeout_s or DEFAULT_DRAIN_TIMEOUT_S)
        wanted = {spec.name: spec for spec in request.models}
        for name, spec in wanted.items():
            version = version_of(spec)
            current = self.running.get(name)
            if current is None or current.version != version:
                plan.add[name] = (spec, version)
            elif _scale(current.spec) != _scale(spec):
                plan.rescale[name] = spec
            else:
                plan.unchanged.append(name)
        if request.mode == pb.DEPLOY_MODE_RECONCILE:
            plan.remove = sorted(set(self.running) - set(wanted))
        return plan

    async def _run(self, record: DeployRecord, request: pb.DeployRequest) -> None:
        if self._one_at_a_time.locked():
            await record.emit("waiting for the running deploy to finish")
        async with self._one_at_a_time:
            await record.emit("started", state=pb.DEPLOY_STATE_RUNNING)
            try:
                if request.use_committed:  # self-heal: bring back the set the state service holds
                    if self._committed is None:
                        raise RuntimeError("no state service to read the committed model set from")
                    request = pb.DeployRequest(models=await self._committed(), mode=pb.DEPLOY_MODE_RECONCILE,
                                               drain_timeout_s=request.drain_timeout_s)
                    await record.emit(f"the committed set: {', '.join(s.name for s in request.models) or 'empty'}")
                ok = await self._apply(record, self.plan(request))
            except asyncio.CancelledError:
                record.error = "cancelled"
                await record.emit("cancelled", state=pb.DEPLOY_STATE_CANCELLED)
                raise
            except Exception as e:  # a bug or Serve failure: report, never leave the record hanging
                log.exception("deploy %s failed", record.deploy_id)
                record.error = f"{type(e).__name__}: {e}"
                await record.emit(record.error, state=pb.DEPLOY_STATE_FAILED)
                return
            if ok and self._commit is not None:
                await self._commit([m.spec for m in self.running.values()], record.deploy_id)
            failed = [p for p in record.models.values() if p.phase == Phase.MODEL_PHASE_FAILED]
            record.error = "; ".join(f"{p.name}: {p.reason}" for p in failed)
            await record.emit(record.error or "done",
                              state=pb.DEPLOY_STATE_SUCCEEDED if ok else pb.DEPLOY_STATE_FAILED)

    async def _apply(self, record: DeployRecord, plan: Plan) -> bool:
        for name in plan.unchanged:
            current = self.running[name]
            await record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_UNCHANGED))
        for name in plan.remove:  # first: the room it frees is there for the new models
            await self._remove(record, name)
        for name, spec in plan.rescale.items():
            current = self.running[name]
            if spec.HasField("autoscaling") or current.spec.HasField("autoscaling"):
                # Serve's own autoscaling config changes only through a redeploy (replicas restart)
                await serve_control.submit({current.app: (spec, current.version)}, self.coordinator_address)
            else:
                await serve_control.rescale(current.app, spec.num_replicas)
            self.running[name] = RunningModel(spec, current.version, current.app, current.load_time_s)
            await record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_LOADING))
            if not await self._await_replicas(name, current.version, spec, self._load_timeout_s):
                await record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_FAILED,
                                                       reason="the replica count was not reached in time"))
                return False
            await record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_RESCALED))
        if not plan.add:
            return True
        apps = {app_name(spec, version): (spec, version) for spec, version in plan.add.values()}
        for spec, version in plan.add.values():
            await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_SCHEDULED))
        t0 = time.monotonic()
        await serve_control.submit(apps, self.coordinator_address)
        results = await asyncio.gather(*[self._await_ready(record, app, spec, version, t0, plan.drain_timeout_s)
                                         for app, (spec, version) in apps.items()])
        return all(results)

    async def _await_ready(self, record: DeployRecord, app: str, spec: common_pb2.ModelSpec, version: str,
                           t0: float, drain_timeout_s: float) -> bool:
        await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_LOADING))
        state = await serve_control.wait_app(app, self._load_timeout_s)
        if state.status != "RUNNING":
            await serve_control.delete(app)  # roll back: the old version (if any) never stopped serving
            await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_FAILED,
                                                   reason=state.message or state.status))
            return False
        old = self.running.get(spec.name)
        self.running[spec.name] = RunningModel(spec, version, app, time.monotonic() - t0)
        # One routing version switches the model to its new replicas...
        await self.table.set_active(spec.name, ActiveModel(version, spec.usecase, spec.max_model_len))
        await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_READY))
        if old is not None and old.app != app:  # ...then the old version drains and goes
            await self._drain(spec.name, old.version, drain_timeout_s)
            await serve_control.delete(old.app)
        return True

    async def _await_replicas(self, name: str, version: str, spec: common_pb2.ModelSpec, timeout_s: float) -> bool:
        """Wait until the routing table holds the spec's replica count (autoscaled: its minimum)."""
        autoscaled = spec.HasField("autoscaling")
        want = max(1, spec.autoscaling.min_replicas if autoscaled else spec.num_replicas)
        deadline = time.monotonic() + timeout_s
        while not ((n := len(self.table.live(name, version))) >= want if autoscaled else n == want):
            if time.monotonic() > deadline:
                return False
            await self.table.wait_newer(self.table.version, max(0.1, deadline - time.monotonic()))
        return True

    async def _drain(self, name: str, version: str, timeout_s: float) -> None:
        """Wait until the old version's replicas report no call in flight in a heartbeat sent after
        the switch (so no gateway still starts calls there), or until the drain timeout."""
        switched = time.monotonic()
        deadline = switched + timeout_s
        while time.monotonic() < deadline:
            replicas = [r for r in self.table.replicas.values() if r.info.model == name and r.info.version == version]
            if all(r.last_seen > switched and r.inflight == 0 for r in replicas):
                return
            await asyncio.sleep(0.2)
        log.warning("%s %s: drain timed out after %.0fs; stopping it with calls in flight", name, version, timeout_s)

    async def _remove(self, record: DeployRecord, name: str) -> None:
        current = self.running.pop(name)
        await self.table.set_active(name, None)  # stop routing before the replicas go
        await record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_REMOVING))
        await serve_control.delete(current.app)
        await record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_REMOVED))

    def _progress(self, name: str, version: str, phase: int, reason: str = "") -> pb.ModelProgress:
        running = self.running.get(name)
        target = running.spec.num_replicas if running else 0
        return pb.ModelProgress(name=name, version=version, phase=phase, reason=reason,
                                ready_replicas=len(self.table.live(name, version)), target_replicas=target)

    async def cancel(self, deploy_id: str) -> DeployRecord | None:
        record = self.records.get(deploy_id)
        if record is not None and record.task is not None and not record.task.done():
            record.task.cancel()
            await asyncio.gather(record.task, return_exceptions=True)
        return record

    async def adopt(self, replicas: list[pb.ReplicaInfo], committed: list[common_pb2.ModelSpec]) -> None:
        """After a coordinator restart: take over the model apps that are still running."""
        apps = await serve_control.model_apps()
        committed_versions = {spec.name: version_of(spec) for spec in committed}
        for info in replicas:
            app = app_name(info.spec, info.version)
            if app not in apps:
                continue
            current = self.running.get(info.model)
            if current is None or committed_versions.get(info.model) == info.version:
                self.running[info.model] = RunningModel(info.spec, info.version, app)
                await self.table.set_active(info.model, ActiveModel(
                    info.version, info.spec.usecase, info.spec.max_model_len))


def _scale(spec: common_pb2.ModelSpec) -> tuple:
    return spec.num_replicas, spec.autoscaling.SerializeToString(deterministic=True)
