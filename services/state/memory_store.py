"""`memory://`: the embedded single-process backend (lost with the process).

Atomicity comes from the event loop: every transaction reads, applies its rule and writes with no
`await` in between, and computes everything it writes before the first assignment. Each run's
replay log is an `EventLog`: followers wake on its appends, it is closed when the run finishes and
failed (NOT_FOUND) when the response is deleted.

A response, its run and its log go `retention_s` after their last write: `_written` keeps the
keys in the order they were last written, so each operation drops the expired ones from its front.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable

from mship.state.v1 import state_pb2 as pb
from services.common.errors import ServiceError
from services.common.event_log import EventLog
from services.common.vocabulary import DEFAULT_STATE_RETENTION_S
from services.state import runs
from services.state.store import EVENT_BATCH, Mutation, Store, snapshot_bytes

Key = tuple[str, str]


class MemoryStore(Store):
    backend = "memory"

    def __init__(self, clock: Callable[[], float] | None = None, follow_poll_s: float = 1.0,
                 retention_s: float = DEFAULT_STATE_RETENTION_S) -> None:
        super().__init__(**({"clock": clock} if clock else {}), follow_poll_s=follow_poll_s, retention_s=retention_s)
        self._data: dict[str, bytes] = {}
        # Serialized, like Redis: callers never share a message with the store.
        self._responses: dict[Key, bytes] = {}
        self._runs: dict[Key, bytes] = {}
        self._logs: dict[Key, EventLog[pb.RunEvent]] = {}
        self._written: OrderedDict[Key, float] = OrderedDict()  # last write, oldest first

    def _touch(self, key: Key) -> None:
        self._written[key] = self.clock()
        self._written.move_to_end(key)

    def _evict(self) -> None:
        """Drop every response whose last write is retention_s old (its followers end NOT_FOUND)."""
        if not self.retention_s:
            return
        cutoff = self.clock() - self.retention_s
        while self._written:
            key, written = next(iter(self._written.items()))
            if written > cutoff:
                return
            self._drop(key)

    def _drop(self, key: Key) -> bool:
        self._written.pop(key, None)
        existed = self._responses.pop(key, None) is not None
        existed = self._runs.pop(key, None) is not None or existed
        log = self._logs.pop(key, None)
        if log is not None:
            log.fail(runs.not_found(*key))  # wakes its followers: they end NOT_FOUND
        return existed

    # ---- blobs ----
    async def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self._data[key] = value

    async def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    # ---- responses ----
    async def put_response(self, response: pb.StoredResponse, create_only: bool = False) -> None:
        self._evict()
        key = (response.key.identity, response.key.response_id)
        if create_only and key in self._responses:
            raise runs.already_exists(key[1])
        self._responses[key] = snapshot_bytes(response, self.clock())
        self._touch(key)

    async def delete_response(self, identity: str, response_id: str) -> bool:
        self._evict()
        return self._drop((identity, response_id))

    async def _load(self, identity: str, response_id: str) -> tuple[pb.StoredResponse | None, pb.StoredRun | None]:
        self._evict()
        data, run = self._responses.get((identity, response_id)), self._runs.get((identity, response_id))
        return (pb.StoredResponse.FromString(data) if data is not None else None,
                pb.StoredRun.FromString(run) if run is not None else None)

    async def _load_run(self, identity: str, response_id: str) -> pb.StoredRun | None:
        self._evict()
        run = self._runs.get((identity, response_id))
        return pb.StoredRun.FromString(run) if run is not None else None

    # ---- runs ----
    async def _create_run(self, identity: str, response_id: str, response: bytes, run: pb.StoredRun) -> None:
        self._evict()
        key = (identity, response_id)
        if key in self._responses or key in self._runs:
            raise runs.already_exists(response_id)
        run_bytes = run.SerializeToString()
        self._responses[key], self._runs[key], self._logs[key] = response, run_bytes, EventLog()
        self._touch(key)

    async def _update_run(self, identity: str, response_id: str, mutate: Mutation) -> pb.RunStatusRecord:
        key = (identity, response_id)
        stored = await self._load_run(identity, response_id)
        if stored is None:
            raise runs.not_found(identity, response_id)
        write = mutate(stored, self.clock())  # may raise: nothing written yet
        if write is None:
            return stored.record
        run_bytes = write.run.SerializeToString()
        # Commit, with no await: followers see it all at once. The log first: it refuses a write
        # to a finished run (the rules never make one) before anything else is written.
        self._logs[key].append(*write.events, close=write.run.record.status in runs.FINISHED)
        if write.response is not None:
            self._responses[key] = write.response
        self._runs[key] = run_bytes
        self._touch(key)
        return write.run.record

    async def _expired_candidates(self, now: float, limit: int) -> list[tuple[str, str]]:
        return [key for key, data in self._runs.items()
                if runs.is_expired(pb.StoredRun.FromString(data).record, now)][:limit]

    # ---- events ----
    async def _events_after(self, identity: str, response_id: str, after: int, limit: int) -> list[pb.RunEvent]:
        log = self._logs.get((identity, response_id))
        # Sequences run 1, 2, 3... so event n sits at index n - 1.
        return log.events[after:after + limit] if log is not None else []

    async def _wait_events(self, identity: str, response_id: str, after: int, timeout_s: float) -> list[pb.RunEvent]:
        log = self._logs.get((identity, response_id))
        if log is None:
            return []  # deleted (or never there): the caller re-checks the run
        # Wake on the first event after `after`, the log's end (finished) or its failure (deleted).
        with contextlib.suppress(TimeoutError, ServiceError):
            async with asyncio.timeout(timeout_s), contextlib.aclosing(log.follow(after)) as events:
                async for _ in events:
                    break
        return log.events[after:after + EVENT_BATCH]
