"""The state store's interface and the logic every backend shares. The backends (`memory://`,
`redis://host:port/db`) live in their own modules; `services.state.backends.open_store` picks one
by URL, so this module imports none of them.

Values are serialized protobuf messages; keys are namespaced under `mship:` and every response,
run and event-log key holds the identity, so another identity's id is simply not found.

A backend implements a few primitives (load, create, delete, and `_update_run`: read a run, apply a
pure rule from `runs.py`, write run + events + snapshot in one transaction); the run operations
and the event follow loop are written once, here, on top of them.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import grpc

from mship.state.v1 import state_pb2 as pb
from services.common.errors import Reason, ServiceError
from services.common.vocabulary import DEFAULT_STATE_RETENTION_S
from services.state import runs

log = logging.getLogger(__name__)
EVENT_BATCH = 256  # events per backend read while replaying


class StoreUnavailable(ServiceError):
    def __init__(self, detail: str) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, Reason.STORE_UNAVAILABLE,
                         f"the state store is unavailable: {detail}", retry_after_s=1.0)


def key_path(identity: str, response_id: str) -> str:
    """`<identity>/<id>`, each part percent-encoded: ('a/b', 'c') and ('a', 'b/c') never collide."""
    return f"{quote(identity, safe='')}/{quote(response_id, safe='')}"


def parse_key_path(path: str) -> tuple[str, str]:
    identity, response_id = path.split("/")
    return unquote(identity), unquote(response_id)


@dataclass
class RunWrite:
    """What one run transaction writes: the run, events to append, optionally a new snapshot."""

    run: pb.StoredRun
    events: list[pb.RunEvent] = field(default_factory=list)
    response: bytes | None = None


# (stored run, now) -> the write, or None for nothing to write. Raises ServiceError to abort:
# it runs before anything is written, so an abort leaves everything as it was.
Mutation = Callable[[pb.StoredRun, float], RunWrite | None]


def snapshot_bytes(response: pb.StoredResponse, now: float, created_at: float = 0.0) -> bytes:
    """The stored form of a snapshot: no `run` (that lives in its own record), a creation time."""
    stored = pb.StoredResponse()
    stored.CopyFrom(response)
    stored.ClearField("run")
    stored.created_at = stored.created_at or created_at or now
    return stored.SerializeToString()


class Store(abc.ABC):
    backend = ""  # its name in metrics: memory | redis

    def __init__(self, clock: Callable[[], float] = time.time, follow_poll_s: float = 1.0,
                 retention_s: float = DEFAULT_STATE_RETENTION_S) -> None:
        if retention_s < 0:
            raise ValueError(f"the retention of stored responses must not be negative, not {retention_s}")
        self.clock = clock
        # A response, its run and its event log go retention_s after the last write to any of them.
        self.retention_s = retention_s
        # How often a follower with nothing new re-checks its run (finished without a terminal
        # event, deleted, lease expired).
        self.follow_poll_s = follow_poll_s

    # ---- plain blobs (committed model sets) ----
    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None: ...

    @abc.abstractmethod
    async def delete(self, key: str) -> bool: ...

    async def close(self) -> None:  # noqa: B027 - most backends hold nothing to close
        pass

    # ---- backend primitives ----
    @abc.abstractmethod
    async def put_response(self, response: pb.StoredResponse, create_only: bool = False) -> None:
        """Upsert a snapshot (ALREADY_EXISTS with create_only when the id is taken)."""

    @abc.abstractmethod
    async def delete_response(self, identity: str, response_id: str) -> bool:
        """Delete the snapshot, its run and its event log in one transaction."""

    @abc.abstractmethod
    async def _load(self, identity: str, response_id: str) -> tuple[pb.StoredResponse | None, pb.StoredRun | None]:
        """The snapshot and the run as stored (one consistent read)."""

    @abc.abstractmethod
    async def _load_run(self, identity: str, response_id: str) -> pb.StoredRun | None: ...

    @abc.abstractmethod
    async def _create_run(self, identity: str, response_id: str, response: bytes, run: pb.StoredRun) -> None:
        """Write snapshot + run together; ALREADY_EXISTS if either exists."""

    @abc.abstractmethod
    async def _update_run(self, identity: str, response_id: str, mutate: Mutation) -> pb.RunStatusRecord:
        """Read the run, apply `mutate`, write its RunWrite in one transaction (NOT_FOUND without a
        run). Returns the run's record as it is afterwards."""

    @abc.abstractmethod
    async def _expired_candidates(self, now: float, limit: int) -> list[tuple[str, str]]:
        """(identity, id) of unfinished runs whose lease ended before `now` (a superset is fine)."""

    @abc.abstractmethod
    async def _events_after(self, identity: str, response_id: str, after: int, limit: int) -> list[pb.RunEvent]: ...

    @abc.abstractmethod
    async def _wait_events(self, identity: str, response_id: str, after: int, timeout_s: float) -> list[pb.RunEvent]:
        """Events after `after`, waiting up to timeout_s for some; [] when none came (or the run
        changed otherwise: the caller re-checks it)."""

    # ---- responses ----
    async def get_response(self, identity: str, response_id: str) -> pb.StoredResponse | None:
        """The snapshot with its run (an expired lease marked FAILED first), or None."""
        snapshot, run = await self._load(identity, response_id)
        if snapshot is None:
            return None
        if run is not None:
            record = run.record
            if runs.is_expired(record, self.clock()):
                record = await self._expire(identity, response_id)
            snapshot.run.CopyFrom(record)
        return snapshot

    # ---- runs ----
    async def create_run(self, response: pb.StoredResponse, status: int = pb.RUN_STATUS_QUEUED, owner: str = "",
                         lease_s: float = 0.0, failure_event_json: str = "") -> pb.RunStatusRecord:
        now = self.clock()
        key = response.key
        record = runs.new_run(key, status, owner, lease_s, now)
        await self._create_run(key.identity, key.response_id, snapshot_bytes(response, now),
                               pb.StoredRun(record=record, failure_event_json=failure_event_json))
        return record

    async def get_run(self, identity: str, response_id: str) -> pb.RunStatusRecord | None:
        run = await self._load_run(identity, response_id)
        if run is None:
            return None
        if runs.is_expired(run.record, self.clock()):
            return await self._expire(identity, response_id)
        return run.record

    async def set_run_status(self, identity: str, response_id: str, status: int, expected: Iterable[int] = (),
                             owner: str = "", lease_s: float = 0.0) -> pb.RunStatusRecord:
        expected = tuple(expected)

        def mutate(stored: pb.StoredRun, now: float) -> RunWrite:
            return RunWrite(_with(stored, runs.set_status(stored.record, now, status, expected, owner, lease_s)))
        return await self._update_run(identity, response_id, mutate)

    async def renew_run(self, identity: str, response_id: str, owner: str, lease_s: float) -> pb.RunStatusRecord:
        def mutate(stored: pb.StoredRun, now: float) -> RunWrite:
            return RunWrite(_with(stored, runs.renew(stored.record, now, owner, lease_s)))
        return await self._update_run(identity, response_id, mutate)

    async def finish_run(self, identity: str, response_id: str, status: int, expected: Iterable[int] = (),
                         owner: str = "", response: pb.StoredResponse | None = None,
                         events: Sequence[pb.RunEvent] = ()) -> pb.RunStatusRecord:
        """Final snapshot + terminal status + last events, all or nothing."""
        expected = tuple(expected)

        def mutate(stored: pb.StoredRun, now: float) -> RunWrite:
            record, numbered = runs.finish(stored.record, now, status, expected, owner, events)
            data = None if response is None else snapshot_bytes(response, now, stored.record.created_at)
            return RunWrite(_with(stored, record), numbered, data)
        return await self._update_run(identity, response_id, mutate)

    async def expire_runs(self, limit: int = 100) -> list[pb.RunStatusRecord]:
        """The sweep: every unfinished run past its lease -> FAILED. Returns those it failed.
        One run it cannot expire (e.g. a record it cannot read) is logged and skipped: it must not
        keep the others unswept. A store found unavailable ends the sweep (the next one retries)."""
        failed = []
        for identity, response_id in await self._expired_candidates(self.clock(), limit):
            try:
                after = await self._expire(identity, response_id)  # re-checked in its transaction
            except ServiceError as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    continue  # deleted meanwhile
                if e.code == grpc.StatusCode.UNAVAILABLE:
                    raise  # the store, not this run: the rest would only wait out the same outage
                log.warning("the sweep skipped run %r of %r: %s", response_id, identity, e.message)
                continue
            except Exception:
                log.exception("the sweep skipped run %r of %r", response_id, identity)
                continue
            if after.status == pb.RUN_STATUS_FAILED and after.detail == runs.LEASE_EXPIRED:
                failed.append(after)
        return failed

    async def _expire(self, identity: str, response_id: str) -> pb.RunStatusRecord:
        def mutate(stored: pb.StoredRun, now: float) -> RunWrite | None:
            record, events = runs.expire(stored.record, now, stored.failure_event_json)
            return RunWrite(_with(stored, record), events) if events else None  # renewed meanwhile
        return await self._update_run(identity, response_id, mutate)

    # ---- event logs ----
    async def append_events(self, identity: str, response_id: str, events: Sequence[pb.RunEvent],
                            owner: str = "") -> int:
        """Append to an unfinished run's log; returns the log's last sequence."""
        def mutate(stored: pb.StoredRun, now: float) -> RunWrite:
            record, numbered = runs.append(stored.record, now, events, owner)
            return RunWrite(_with(stored, record), numbered)
        return (await self._update_run(identity, response_id, mutate)).last_sequence

    async def read_events(self, identity: str, response_id: str, after: int = 0,
                          follow: bool = False) -> AsyncIterator[pb.RunEvent]:
        """Every event after `after`, once each, in order; with follow, through the terminal one."""
        run = await self.get_run(identity, response_id)
        if run is None:
            raise runs.not_found(identity, response_id)
        while True:
            batch = await self._events_after(identity, response_id, after, EVENT_BATCH)
            caught_up = len(batch) < EVENT_BATCH
            if caught_up and not batch and follow and run.status not in runs.FINISHED:
                batch = await self._wait_events(identity, response_id, after, self._wait_s(run))
                if not batch:
                    # Nothing came: finished without a terminal event, deleted, or the lease ran out
                    # (get_run marks it FAILED and writes the failure event, read on the next drain).
                    run = await self.get_run(identity, response_id)
                    if run is None:
                        raise runs.not_found(identity, response_id)
                    continue
            for event in batch:
                yield event
                after = event.sequence
                if event.terminal:
                    return
            # Caught up. `run` was read before this drain, so if it was finished then, its events
            # were all written then (finishing writes them in the same transaction): done.
            if caught_up and (not follow or run.status in runs.FINISHED):
                return

    def _wait_s(self, run: pb.RunStatusRecord) -> float:
        """How long a caught-up follower waits before re-checking its run: the poll, or less when
        the owner's lease ends sooner."""
        if run.owner_expires_at > 0:
            return min(self.follow_poll_s, max(0.01, run.owner_expires_at - self.clock() + 0.01))
        return self.follow_poll_s


def _with(stored: pb.StoredRun, record: pb.RunStatusRecord) -> pb.StoredRun:
    return pb.StoredRun(record=record, failure_event_json=stored.failure_event_json)
