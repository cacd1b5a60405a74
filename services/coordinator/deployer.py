"""Apply a model set: additive or reconcile, one deploy at a time, progress as a stream of events.

Per model: same version -> unchanged (or rescaled in place when only the scale differs, or when
the live replica count drifted from it); a new name -> a new Serve app; a changed version -> the
new app loads beside the old one, the route switches once it is ready, then the old app drains
and is deleted; a failed new version is deleted and the old one keeps serving, a failed rescale
goes back to the old count. A cancelled (or superseded) deploy goes back to the set that ran
before it. After a deploy the set that runs is written to the state service as the committed set.
"""

from __future__ import annotations

import asyncio
import logging
import re
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
    cancelling: bool = False  # set once: a restore in progress is never interrupted by a second cancel

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
        self._active: DeployRecord | None = None
        self._pending_apps: set[str] = set()  # submitted, neither switched to nor deleted yet
        self._submitting: asyncio.Future | None = None

    def start(self, request: pb.DeployRequest) -> DeployRecord:
        record = DeployRecord(deploy_id=uuid.uuid4().hex[:12])
        self.records[record.deploy_id] = record
        self.latest = record.deploy_id
        record.task = asyncio.create_task(self._run(record, request))
        return record

    async def plan(self, request: pb.DeployRequest) -> Plan:
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
        # The same config again restores a fixed replica count that drifted from it in Serve.
        for name in await self._drifted(plan.unchanged):
            plan.unchanged.remove(name)
            plan.rescale[name] = self.running[name].spec
        if request.mode == pb.DEPLOY_MODE_RECONCILE:
            plan.remove = sorted(set(self.running) - set(wanted))
        return plan

    async def _run(self, record: DeployRecord, request: pb.DeployRequest) -> None:
        if request.supersede:
            for other in [r for r in self.records.values() if r is not record and r.task and not r.task.done()]:
                await record.emit(f"superseding deploy {other.deploy_id}")
                await self.cancel(other.deploy_id)
        if self._one_at_a_time.locked() and self._active is not None:
            await record.emit(f"queued behind deploy {self._active.deploy_id}; it runs when that one ends "
                              "(or deploy with --supersede to cancel that one)")
        try:
            async with self._one_at_a_time:
                self._active = record
                try:
                    await self._execute(record, request)
                finally:
                    self._active = None
        except asyncio.CancelledError:
            if record.state not in TERMINAL:  # cancelled while queued: nothing ran
                record.error = "cancelled"
                await record.emit("cancelled while queued", state=pb.DEPLOY_STATE_CANCELLED)
            raise

    async def _execute(self, record: DeployRecord, request: pb.DeployRequest) -> None:
        before = dict(self.running)
        await record.emit("started", state=pb.DEPLOY_STATE_RUNNING)
        try:
            if request.use_committed:  # self-heal: bring back the set the state service holds
                if self._committed is None:
                    raise RuntimeError("no state service to read the committed model set from")
                request = pb.DeployRequest(models=await self._committed(), mode=pb.DEPLOY_MODE_RECONCILE,
                                           drain_timeout_s=request.drain_timeout_s)
                await record.emit(f"the committed set: {', '.join(s.name for s in request.models) or 'empty'}")
            ok = await self._apply(record, await self.plan(request))
        except asyncio.CancelledError:
            await record.emit("cancelled: going back to the set that ran before this deploy")
            try:
                await self._restore(record, before)
            except Exception as e:
                log.exception("deploy %s: restore after cancel failed", record.deploy_id)
                record.error = f"cancelled; going back failed: {type(e).__name__}: {e}"
            else:
                record.error = "cancelled"
            await record.emit(record.error, state=pb.DEPLOY_STATE_CANCELLED)
            raise
        except Exception as e:  # a bug or Serve failure: report, never leave the record hanging
            log.exception("deploy %s failed", record.deploy_id)
            record.error = f"{type(e).__name__}: {e}"
            await record.emit(record.error, state=pb.DEPLOY_STATE_FAILED)
            return
        # What runs now is committed, also after a partial failure (a failed model kept its old
        # version or count), so the stored set stays true to what serves.
        if self._commit is not None and (ok or _specs(self.running) != _specs(before)):
            await self._commit([m.spec for m in self.running.values()], record.deploy_id)
        failed = [p for p in record.models.values() if p.phase == Phase.MODEL_PHASE_FAILED]
        record.error = "; ".join(f"{p.name}: {p.reason}" for p in failed)
        await record.emit(record.error or "done", state=pb.DEPLOY_STATE_SUCCEEDED if ok else pb.DEPLOY_STATE_FAILED)

    async def _restore(self, record: DeployRecord, before: dict[str, RunningModel]) -> None:
        """Back to `before`: new apps still loading are deleted; scale changes are undone in place;
        models switched, added or removed by the deploy are reconciled back."""
        if self._submitting is not None:
            await asyncio.wait({self._submitting})
        for app in sorted(self._pending_apps):
            await serve_control.delete(app)
        self._pending_apps.clear()
        plan = await self.plan(pb.DeployRequest(models=[m.spec for m in before.values()],
                                                mode=pb.DEPLOY_MODE_RECONCILE))
        await self._apply(record, plan)

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
                self.running[name] = current  # back to the count that served before
                if not current.spec.HasField("autoscaling") and not spec.HasField("autoscaling"):
                    await serve_control.rescale(current.app, current.spec.num_replicas)
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
        self._pending_apps.update(apps)
        # Shielded: Serve's call runs in a thread that a cancel cannot stop, and a restore must not
        # delete the apps before that thread has created them.
        self._submitting = asyncio.ensure_future(serve_control.submit(apps, self.coordinator_address))
        await asyncio.shield(self._submitting)
        results = await asyncio.gather(*[self._await_ready(record, app, spec, version, t0, plan.drain_timeout_s)
                                         for app, (spec, version) in apps.items()])
        return all(results)

    async def _await_ready(self, record: DeployRecord, app: str, spec: common_pb2.ModelSpec, version: str,
                           t0: float, drain_timeout_s: float) -> bool:
        await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_LOADING))
        state = await serve_control.wait_app(app, self._load_timeout_s)
        if state.status != "RUNNING":
            await serve_control.delete(app)  # roll back: the old version (if any) never stopped serving
            self._pending_apps.discard(app)
            await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_FAILED,
                                                   reason=failure_reason(state.message) or state.status))
            return False
        old = self.running.get(spec.name)
        self.running[spec.name] = RunningModel(spec, version, app, time.monotonic() - t0)
        self._pending_apps.discard(app)
        # One routing version switches the model to its new replicas...
        await self.table.set_active(spec.name, ActiveModel(version, spec.usecase, spec.max_model_len))
        await record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_READY))
        if old is not None and old.app != app:  # ...then the old version drains and goes
            await self._drain(spec.name, old.version, drain_timeout_s)
            await serve_control.delete(old.app)
        return True

    async def _drifted(self, names: list[str]) -> set[str]:
        """Models with a fixed replica count whose Serve deployment no longer runs that count."""
        fixed = [n for n in names if not self.running[n].spec.HasField("autoscaling")]
        if not fixed:
            return set()
        apps = await serve_control.model_apps()
        return {n for n in fixed if (a := apps.get(self.running[n].app)) is not None
                and a.target_replicas != self.running[n].spec.num_replicas}

    async def _await_replicas(self, name: str, version: str, spec: common_pb2.ModelSpec, timeout_s: float) -> bool:
        """Wait until the routing table holds the spec's replica count (autoscaled: its minimum)."""
        autoscaled = spec.HasField("autoscaling")
        want = max(1, spec.autoscaling.min_replicas if autoscaled else spec.num_replicas)
        deadline = time.monotonic() + timeout_s
        while True:
            n = len(self.table.live(name, version))
            if n >= want if autoscaled else n == want:
                break
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

    async def cancel(self, deploy_id: str, wait_s: float = 120.0) -> DeployRecord | None:
        """Cancel a queued or running deploy and wait (up to `wait_s`) until it has gone back."""
        record = self.records.get(deploy_id)
        if record is not None and record.task is not None and not record.task.done():
            if not record.cancelling:
                record.cancelling = True
                record.task.cancel()
            await asyncio.wait({record.task}, timeout=wait_s)
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


def failure_reason(message: str) -> str:
    """Serve's message about a replica that failed to start, down to what the operator needs: its
    first sentence and the exception at the end of the traceback it carries."""
    if "Traceback" not in message:
        return message.strip()
    head = message.split("Traceback", 1)[0].strip().split(". ")[0].rstrip(".:")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return f"{head}: {errors[-1] if errors else lines[-1]}"


def _specs(running: dict[str, RunningModel]) -> dict[str, bytes]:
    return {name: m.spec.SerializeToString(deterministic=True) for name, m in running.items()}


def _scale(spec: common_pb2.ModelSpec) -> tuple:
    return spec.num_replicas, spec.autoscaling.SerializeToString(deterministic=True)
