"""Deploys as the coordinator runs them: one at a time, the others queued behind it (or
superseding it), each cancellable back to the set that ran before it, progress in the deploy log.

The plan comes from `planner`, `executor` carries it out on Serve. After a deploy the set that runs
is written to the state service as the committed set whenever it differs from the set before, also
after a partial failure, a Serve error or a cancel that could not go all the way back, so the
stored set stays true to what serves. A coordinator's recovery after a restart holds the deploys
back (`exclusive`) until it has adopted what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from services.coordinator.deploy_log import KEEP_FINISHED, DeployRecord, DeployRecords
from services.coordinator.executor import DEFAULT_LOAD_TIMEOUT_S, Executor
from services.coordinator.planner import RunningModel, specs_of
from services.coordinator.registry import ActiveModel, ReplicaRegistry
from services.coordinator.serve_control import ServeControl
from services.coordinator.spec_rules import normalize

log = logging.getLogger(__name__)
Phase = pb.ModelPhase
Commit = Callable[[list[common_pb2.ModelSpec], str], Awaitable[None]]
Committed = Callable[[], Awaitable[list[common_pb2.ModelSpec] | None]]  # None: no set was ever stored


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
        self._busy_with = ""  # what holds `_one_at_a_time`: a deploy, or the coordinator's recovery

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
            if not record.cancelling and not record.committing:  # committing: it ends by itself
                record.cancelling = True
                record.task.cancel()
            await asyncio.wait({record.task}, timeout=wait_s)
        return record

    @contextlib.asynccontextmanager
    async def exclusive(self, what: str) -> AsyncIterator[None]:
        """Hold the deploys back while `what` runs (a queued deploy says it waits for `what`). The
        recovery after a restart holds them: a deploy planned against a running set not yet
        adopted would duplicate or orphan what runs."""
        async with self._one_at_a_time:
            self._busy_with = what
            try:
                yield
            finally:
                self._busy_with = ""

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
            if self._one_at_a_time.locked() and self._busy_with:
                record.emit(f"queued behind {self._busy_with}")
            async with self.exclusive(f"deploy {record.deploy_id}; it runs when that one ends "
                                      "(or deploy with --supersede to cancel that one)"):
                await self._execute(record, request)
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
                request = await self._committed_request(record, request)
            ok = await executor.apply(record, await executor.plan(request))
            if request.mode == pb.DEPLOY_MODE_RECONCILE:
                await self.registry.settle_expected(s.name for s in request.models)
        except asyncio.CancelledError:
            record.emit("cancelled: going back to the set that ran before this deploy")
            try:
                failed = await executor.restore(record, before)
                record.error = "cancelled" + (f"; going back failed for {', '.join(failed)}" if failed else "")
            except Exception as e:
                log.exception("deploy %s: restore after cancel failed", record.deploy_id)
                record.error = f"cancelled; going back failed: {type(e).__name__}: {e}"
            if (error := await self._commit_changes(record, before)) is not None:
                record.error += f"; {error}"
            record.emit(record.error, state=pb.DEPLOY_STATE_CANCELLED)
            raise
        except Exception as e:  # a bug or Serve failure: report, never leave the record hanging
            log.exception("deploy %s failed", record.deploy_id)
            record.error = f"{type(e).__name__}: {e}"
            if (error := await self._commit_changes(record, before)) is not None:
                record.error += f"; {error}"
            record.emit(record.error, state=pb.DEPLOY_STATE_FAILED)
            return
        failed = [f"{p.name}: {p.reason}" for p in record.models.values() if p.phase == Phase.MODEL_PHASE_FAILED]
        if (error := await self._commit_changes(record, before, always=ok)) is not None:
            ok = False
            failed.append(error)
        record.error = "; ".join(failed)
        record.emit(record.error or "done", state=pb.DEPLOY_STATE_SUCCEEDED if ok else pb.DEPLOY_STATE_FAILED)

    async def _committed_request(self, record: DeployRecord, request: pb.DeployRequest) -> pb.DeployRequest:
        """The self-heal deploy's request: the committed set, reconciled. Where none is stored (the
        state service lost it), what runs stays, and is committed: reconciling to an empty set
        would remove every model."""
        if self._committed is None:
            raise RuntimeError("no state service to read the committed model set from")
        drain = request.drain_timeout_s if request.HasField("drain_timeout_s") else None
        committed = await self._committed()
        if committed is None:
            running = [m.spec for m in self._executor.running.values()]
            record.emit("no committed set is stored (none was written yet, or the state service lost it): "
                        f"what runs stays{' and becomes the committed set' if running else ''}")
            return pb.DeployRequest(models=running, mode=pb.DEPLOY_MODE_RECONCILE, drain_timeout_s=drain)
        for spec in committed:  # a set stored before `check_deploy` normalized what it accepts
            normalize(spec)
        record.emit(f"the committed set: {', '.join(s.name for s in committed) or 'empty'}")
        return pb.DeployRequest(models=committed, mode=pb.DEPLOY_MODE_RECONCILE, drain_timeout_s=drain)

    async def _commit_changes(self, record: DeployRecord, before: dict[str, RunningModel],
                              always: bool = False) -> str | None:
        """Write the running set as the committed set (`always`, or when it differs from `before`).
        Too late to cancel meanwhile: what it writes is in place. The error, if the write failed."""
        executor = self._executor
        if self._commit is None or not (always or specs_of(executor.running) != specs_of(before)):
            return None
        record.committing = True
        write = asyncio.ensure_future(self._commit([m.spec for m in executor.running.values()], record.deploy_id))
        try:
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:  # a cancel that came just before `committing` was set
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                await asyncio.wait({write})
                write.result()
        except Exception as e:  # what runs stays; the deploy says the stored set is behind it
            log.exception("deploy %s: writing the committed set failed", record.deploy_id)
            return f"the committed set was not written: {type(e).__name__}: {e}"
        finally:
            record.committing = False
        return None
