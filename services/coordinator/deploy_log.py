"""The deploy log: one record per deploy (its state, per-model progress and event stream), and the
bounded store of them: queued and running deploys stay, of the finished ones only the latest few.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from mship.coordinator.v1 import coordinator_pb2 as pb
from services.common.event_log import EventLog
from services.coordinator.metrics import DEPLOYS, OUTCOMES

TERMINAL = (pb.DEPLOY_STATE_SUCCEEDED, pb.DEPLOY_STATE_FAILED, pb.DEPLOY_STATE_CANCELLED)
KEEP_FINISHED = 64  # finished deploys kept for GetDeployment, oldest dropped first


@dataclass
class DeployRecord:
    deploy_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    models: dict[str, pb.ModelProgress] = field(default_factory=dict)
    state: int = pb.DEPLOY_STATE_QUEUED
    error: str = ""
    started_at: float = field(default_factory=time.time)
    finished_at: float = 0.0
    events: EventLog[pb.DeployEvent] = field(default_factory=EventLog)
    task: asyncio.Task | None = None
    cancelling: bool = False  # set once: a restore in progress is never interrupted by a second cancel
    committing: bool = False  # what it changed is in place and being committed: too late to cancel

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    def emit(self, message: str = "", model: pb.ModelProgress | None = None, state: int | None = None) -> None:
        """Record progress as one event; a terminal state ends the stream."""
        if state is not None:
            self.state = state
            if state in TERMINAL:
                self.finished_at = time.time()
                DEPLOYS.labels(OUTCOMES[state]).inc()
        if model is not None:
            self.models[model.name] = model
        event = pb.DeployEvent(deploy_id=self.deploy_id, state=self.state, message=message)
        if model is not None:
            event.model.CopyFrom(model)
        self.events.append(event, close=self.finished)

    def follow(self) -> AsyncIterator[pb.DeployEvent]:
        """Every event from the first, then new ones until the deploy ends."""
        return self.events.follow()

    def in_flight(self) -> bool:
        return self.task is not None and not self.task.done()

    def to_proto(self) -> pb.Deployment:
        return pb.Deployment(deploy_id=self.deploy_id, state=self.state, models=list(self.models.values()),
                             error=self.error, started_at=self.started_at, finished_at=self.finished_at)


class DeployRecords:
    """Deploys by id, in start order; `latest` is the last one started."""

    def __init__(self, keep_finished: int = KEEP_FINISHED) -> None:
        self.keep_finished = keep_finished
        self._records: collections.OrderedDict[str, DeployRecord] = collections.OrderedDict()
        self.latest = ""

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: DeployRecord) -> None:
        self._records[record.deploy_id] = record
        self.latest = record.deploy_id
        self.prune()

    def get(self, deploy_id: str = "") -> DeployRecord | None:
        """The deploy `deploy_id` ("" for the latest)."""
        return self._records.get(deploy_id or self.latest)

    def in_flight(self) -> list[DeployRecord]:
        """Queued and running deploys, oldest first."""
        return [r for r in self._records.values() if r.in_flight()]

    def prune(self) -> None:
        """Drop the oldest finished deploys beyond `keep_finished`; unfinished ones always stay."""
        finished = [r.deploy_id for r in self._records.values() if r.finished and not r.in_flight()]
        for deploy_id in finished[:max(0, len(finished) - self.keep_finished)]:
            del self._records[deploy_id]
