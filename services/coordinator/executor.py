"""Carrying out a plan on Serve (through an injected `ServeControl`), reporting to a deploy record.

Removed models stop routing before their replicas go; a rescale changes the live deployment in
place (a failed one goes back to the old count); a new version loads beside the old one, the
route switches once it runs, then the old one drains and is deleted; a failed new version is
deleted and the old one keeps serving. `restore` goes back to an earlier running set.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deploy_log import DeployRecord
from services.coordinator.fingerprint import app_name
from services.coordinator.placement import unhostable
from services.coordinator.planner import Plan, RunningModel, needs_serve_targets, plan_deploy, specs_of
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from services.coordinator.serve_control import ModelApps, ServeControl

log = logging.getLogger(__name__)
Phase = pb.ModelPhase
DEFAULT_LOAD_TIMEOUT_S = 900.0


class Executor:
    def __init__(self, registry: ReplicaRegistry, serve: ServeControl, coordinator_address: str,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S, drain_poll_s: float = 0.2) -> None:
        self.registry, self.serve = registry, serve
        self.coordinator_address = coordinator_address
        self.running: dict[str, RunningModel] = {}
        self.load_timeout_s = load_timeout_s
        self.drain_poll_s = drain_poll_s
        self._pending_apps: set[str] = set()  # submitted, neither switched to nor deleted yet
        self._submitting: asyncio.Future | None = None

    async def plan(self, request: pb.DeployRequest) -> Plan:
        targets = {}
        if needs_serve_targets(self.running):
            targets = {name: app.target_replicas for name, app in (await self.serve.model_apps()).items()}
        return plan_deploy(self.running, request, targets)

    async def restore(self, record: DeployRecord, before: dict[str, RunningModel]) -> list[str]:
        """Back to `before`: new apps still loading are deleted; scale changes are undone in place;
        models switched, added or removed by the deploy are reconciled back. The models that could
        not go back (each kept what it ran)."""
        if self._submitting is not None:
            await asyncio.wait({self._submitting})
        for app in sorted(self._pending_apps):
            await self.serve.delete(app)
        self._pending_apps.clear()
        plan = await self.plan(pb.DeployRequest(models=[m.spec for m in before.values()],
                                                mode=pb.DEPLOY_MODE_RECONCILE))
        await self.apply(record, plan)
        now, then = specs_of(self.running), specs_of(before)
        return sorted(name for name in now.keys() | then.keys() if now.get(name) != then.get(name))

    async def apply(self, record: DeployRecord, plan: Plan) -> bool:
        """Carry out `plan`; False when some model failed (it kept its old version or count)."""
        for name in plan.unchanged:
            current = self.running[name]
            record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_UNCHANGED))
        for name, spec in plan.relimit.items():
            current = self.running[name]
            self.running[name] = RunningModel(spec, current.version, current.app, current.load_time_s)
            await self.registry.set_active(name, ActiveModel.of(spec, current.version))
            record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_UNCHANGED,
                                             reason="admission limits updated (no reload)"))
        for name in plan.remove:  # first: the room it frees is there for the new models
            await self._remove(record, name)
        rescaled = [await self._rescale(record, name, spec) for name, spec in plan.rescale.items()]
        ok = all(rescaled)  # a failed rescale keeps its old count; the other models still go on
        if not plan.add:
            return ok
        apps = {app_name(spec, version): (spec, version) for spec, version in plan.add.values()}
        for spec, version in plan.add.values():
            record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_SCHEDULED))
        waiting, refused = await self._unhostable(record, apps)
        ok = ok and not refused
        if not apps:
            return ok
        t0 = time.monotonic()
        self._pending_apps.update(apps)
        # Shielded: Serve's call runs in a thread that a cancel cannot stop, and a restore must not
        # delete the apps before that thread has created them.
        self._submitting = asyncio.ensure_future(self.serve.submit(apps, self.coordinator_address))
        await asyncio.shield(self._submitting)
        for app, why in waiting.items():
            await self._wait_for_room(record, app, *apps[app], why)
        waits = [asyncio.ensure_future(self._await_ready(record, app, spec, version, t0, plan.drain_timeout_s))
                 for app, (spec, version) in apps.items() if app not in waiting]
        try:
            return all(await asyncio.gather(*waits)) and ok
        except Exception:
            # One model's wait broke (a Serve failure): the others must not go on switching routes
            # for a deploy that has failed; what never switched is torn down, the old versions serve.
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            for app in sorted(self._pending_apps & set(apps)):
                await self.serve.delete(app)
                self._pending_apps.discard(app)
            raise

    async def _unhostable(self, record: DeployRecord, apps: ModelApps) -> tuple[dict[str, str], bool]:
        """Models no alive node can host now. A new one is still submitted and waits (-> app: why);
        a new version of a served one is refused (taken out of `apps`) and the old one serves on."""
        nodes = await self.serve.nodes()
        waiting, refused = {}, False
        for app, (spec, version) in list(apps.items()):
            why = unhostable(spec, nodes)
            if why is None:
                continue
            if spec.name in self.running:
                del apps[app]
                refused = True
                record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_FAILED, reason=why))
            else:
                waiting[app] = why
        return waiting, refused

    async def _wait_for_room(self, record: DeployRecord, app: str, spec: common_pb2.ModelSpec, version: str,
                             why: str) -> None:
        """A new model no node can host yet: it is deployed and routed (with no replica, so pending)
        and Ray starts its replica when a node that can run it joins; the deploy does not wait."""
        self.running[spec.name] = RunningModel(spec, version, app, 0.0)
        self._pending_apps.discard(app)
        await self.registry.set_active(spec.name, ActiveModel.of(spec, version))
        record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_PENDING, reason=why))

    async def _rescale(self, record: DeployRecord, name: str, spec: common_pb2.ModelSpec) -> bool:
        current = self.running[name]
        in_place = not spec.HasField("autoscaling") and not current.spec.HasField("autoscaling")
        if in_place:
            await self.serve.rescale(current.app, spec.num_replicas)
        else:  # Serve's own autoscaling config changes only through a redeploy (replicas restart)
            await self.serve.submit({current.app: (spec, current.version)}, self.coordinator_address)
        self.running[name] = RunningModel(spec, current.version, current.app, current.load_time_s)
        record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_LOADING))
        if not await self._await_replicas(name, current.version, spec, self.load_timeout_s):
            self.running[name] = current  # back to the count that served before
            if in_place:
                await self.serve.rescale(current.app, current.spec.num_replicas)
            else:  # Serve holds the submitted config: submit the old one again
                await self.serve.submit({current.app: (current.spec, current.version)}, self.coordinator_address)
            record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_FAILED,
                                             reason="the replica count was not reached in time"))
            return False
        await self.registry.set_active(name, ActiveModel.of(spec, current.version))  # its rate limits, if changed
        record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_RESCALED))
        return True

    async def _await_ready(self, record: DeployRecord, app: str, spec: common_pb2.ModelSpec, version: str,
                           t0: float, drain_timeout_s: float) -> bool:
        record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_LOADING))
        state = await self.serve.wait_app(app, self.load_timeout_s)
        if state.status != "RUNNING":
            await self.serve.delete(app)  # roll back: the old version (if any) never stopped serving
            self._pending_apps.discard(app)
            record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_FAILED,
                                             reason=failure_reason(state.message) or state.status))
            return False
        old = self.running.get(spec.name)
        self.running[spec.name] = RunningModel(spec, version, app, time.monotonic() - t0)
        self._pending_apps.discard(app)
        # One routing version switches the model to its new replicas...
        await self.registry.set_active(spec.name, ActiveModel.of(spec, version))
        record.emit(model=self._progress(spec.name, version, Phase.MODEL_PHASE_READY))
        if old is not None and old.app != app:  # ...then the old version drains and goes
            await self._drain(spec.name, old.version, drain_timeout_s)
            await self.serve.delete(old.app)
        return True

    async def _await_replicas(self, name: str, version: str, spec: common_pb2.ModelSpec, timeout_s: float) -> bool:
        """Wait until the registry holds the spec's replica count (autoscaled: its minimum)."""
        autoscaled = spec.HasField("autoscaling")
        want = max(1, spec.autoscaling.min_replicas if autoscaled else spec.num_replicas)
        deadline = time.monotonic() + timeout_s
        while True:
            n = len(self.registry.live(name, version))
            if n >= want if autoscaled else n == want:
                return True
            if time.monotonic() > deadline:
                return False
            await self.registry.wait_newer(self.registry.version, max(0.1, deadline - time.monotonic()))

    async def _drain(self, name: str, version: str, timeout_s: float) -> None:
        """Wait until the old version's replicas report no call in flight in a heartbeat sent after
        the switch, or until the drain timeout. A gateway whose snapshot still trails the switch
        when they stop finds the new replicas by itself (services/common/infer.py `Attempts`)."""
        switched = time.monotonic()
        deadline = switched + timeout_s
        while time.monotonic() < deadline:
            replicas = self.registry.replicas_of(name, version)
            if all(r.last_seen > switched and r.load.inflight_calls == 0 for r in replicas):
                return
            await asyncio.sleep(self.drain_poll_s)  # heartbeats carry no wake-up: poll them
        log.warning("%s %s: drain timed out after %.0fs; stopping it with calls in flight", name, version, timeout_s)

    async def _remove(self, record: DeployRecord, name: str) -> None:
        current = self.running.pop(name)
        await self.registry.set_active(name, None)  # stop routing before the replicas go
        record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_REMOVING))
        await self.serve.delete(current.app)
        record.emit(model=self._progress(name, current.version, Phase.MODEL_PHASE_REMOVED))

    def _progress(self, name: str, version: str, phase: int, reason: str = "") -> pb.ModelProgress:
        running = self.running.get(name)
        target = running.spec.num_replicas if running else 0
        return pb.ModelProgress(name=name, version=version, phase=phase, reason=reason,
                                ready_replicas=len(self.registry.live(name, version)), target_replicas=target)


def failure_reason(message: str) -> str:
    """Serve's message about a replica that failed to start, down to what the operator needs: its
    first sentence and the exception at the end of the traceback it carries."""
    if "Traceback" not in message:
        return message.strip()
    head = message.split("Traceback", 1)[0].strip().split(". ")[0].rstrip(".:")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return f"{head}: {errors[-1] if errors else lines[-1]}"
