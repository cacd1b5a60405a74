"""Deploys as the coordinator runs them: one at a time, the others queued behind it (or
superseding it), each cancellable back to the set that ran before it, progress in the deploy log.

The plan comes from `planner`, `executor` carries it out on Serve. After a deploy the set that runs
is written to the state service as the committed set, also after a partial failure (a failed
model kept its old version or count), so the stored set stays true to what serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deploy_log import KEEP_FINISHED, DeployRecord, DeployRecords
from services.coordinator.executor import DEFAULT_LOAD_TIMEOUT_S, Executor
from services.coordinator.planner import RunningModel, specs_of
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from services.coordinator.serve_control import ServeControl

log = logging.getLogger(__name__)
Phase = pb.ModelPhase
Commit = Callable[[list[common_pb2.ModelSpec], str], Awaitable[None]]
Committed = Callable[[], Awaitable[list[common_pb2.ModelSpec]]]


class Deployer:
    def __init__(self, registry: ReplicaRegistry, serve: ServeControl, coordinator_address: str,
                 commit: Commit | None = None, committed: Committed | None = None,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S, keep_finished: int = KEEP_FINISHED,
                 drain_poll_s: float = 0.2) -> None:
        self.registry = registry
        self.records = DeployRecords(keep_finished)
        self._executor = Executor(registry, serve, coordinator_address, load_timeout_s, drain_poll_s)
        self._commit = commit
        self._committed = committed
        self._one_at_a_time = asyncio.Lock()
        self._active: DeployRecord | None = None

    # ---- the public API the servicer and recovery use ------------------------------------------
    def start(self, request: pb.DeployRequest) -> DeployRecord:
        """Start a deploy (it queues behind a running one); follow it through the record."""
        record = DeployRecord()
        record.task = asyncio.create_task(self._run(record, request))
        self.records.add(record)
        return record

    def get(self, deploy_id: str = "") -> DeployRecord | None:
        """A deploy by id ("" for the latest); None when unknown or pruned."""
        return self.records.get(deploy_id)

    def running_models(self) -> list[RunningModel]:
        """The models that serve now, by name."""
        return [self._executor.running[name] for name in sorted(self._executor.running)]

    async def cancel(self, deploy_id: str, wait_s: float = 120.0) -> DeployRecord | None:
        """Cancel a queued or running deploy and wait (up to `wait_s`) until it has gone back."""
        record = self.records.get(deploy_id) if deploy_id else None
        if record is not None and record.task is not None and record.in_flight():
            if not record.cancelling:
                record.cancelling = True
                record.task.cancel()
            await asyncio.wait({record.task}, timeout=wait_s)
        return record

    async def adopt(self, models: dict[str, RunningModel]) -> None:
        """Take over models that already run (after a coordinator restart) and route them."""
        for name, model in models.items():
            self._executor.running[name] = model
            await self.registry.set_active(name, ActiveModel.of(model.spec, model.version))

    # ---- running one deploy ------------------------------------------------------------------
    async def _run(self, record: DeployRecord, request: pb.DeployRequest) -> None:
        try:  # everything, the supersede wait included: a cancel at any point ends the record
            if request.supersede:
                for other in [r for r in self.records.in_flight() if r is not record]:
                    record.emit(f"superseding deploy {other.deploy_id}")
                    await self.cancel(other.deploy_id)
            if self._one_at_a_time.locked() and self._active is not None:
                record.emit(f"queued behind deploy {self._active.deploy_id}; it runs when that one ends "
                            "(or deploy with --supersede to cancel that one)")
            async with self._one_at_a_time:
                self._active = record
                try:
                    await self._execute(record, request)
                finally:
                    self._active = None
        except asyncio.CancelledError:
            if not record.finished:  # cancelled while queued: nothing ran
                record.error = "cancelled"
                record.emit("cancelled while queued", state=pb.DEPLOY_STATE_CANCELLED)
            raise

    async def _execute(self, record: DeployRecord, request: pb.DeployRequest) -> None:
        executor = self._executor
        before = dict(executor.running)
        record.emit("started", state=pb.DEPLOY_STATE_RUNNING)
        try:
            if request.use_committed:  # self-heal: bring back the set the state service holds
                if self._committed is None:
                    raise RuntimeError("no state service to read the committed model set from")
                request = pb.DeployRequest(models=await self._committed(), mode=pb.DEPLOY_MODE_RECONCILE,
                                           drain_timeout_s=request.drain_timeout_s)
                record.emit(f"the committed set: {', '.join(s.name for s in request.models) or 'empty'}")
            ok = await executor.apply(record, await executor.plan(request))
            if request.mode == pb.DEPLOY_MODE_RECONCILE:
                await self.registry.settle_expected(s.name for s in request.models)
        except asyncio.CancelledError:
            record.emit("cancelled: going back to the set that ran before this deploy")
            try:
                await executor.restore(record, before)
            except Exception as e:
                log.exception("deploy %s: restore after cancel failed", record.deploy_id)
                record.error = f"cancelled; going back failed: {type(e).__name__}: {e}"
            else:
                record.error = "cancelled"
            record.emit(record.error, state=pb.DEPLOY_STATE_CANCELLED)
            raise
        except Exception as e:  # a bug or Serve failure: report, never leave the record hanging
            log.exception("deploy %s failed", record.deploy_id)
            record.error = f"{type(e).__name__}: {e}"
            record.emit(record.error, state=pb.DEPLOY_STATE_FAILED)
            return
        failed = [f"{p.name}: {p.reason}" for p in record.models.values() if p.phase == Phase.MODEL_PHASE_FAILED]
        if self._commit is not None and (ok or specs_of(executor.running) != specs_of(before)):
            try:
                await self._commit([m.spec for m in executor.running.values()], record.deploy_id)
            except Exception as e:  # what runs stays; the deploy says the stored set is behind it
                log.exception("deploy %s: writing the committed set failed", record.deploy_id)
                ok = False
                failed.append(f"the committed set was not written: {type(e).__name__}: {e}")
        record.error = "; ".join(failed)
        record.emit(record.error or "done", state=pb.DEPLOY_STATE_SUCCEEDED if ok else pb.DEPLOY_STATE_FAILED)
