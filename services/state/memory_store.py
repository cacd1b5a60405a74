"""`memory://`: the embedded single-process backend (lost with the process).

Atomicity comes from the event loop: every transaction reads, applies its rule and writes with no
`await` in between, and computes everything it writes before the first assignment. Followers wait
on one asyncio.Condition per run, notified on every change to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mship.state.v1 import state_pb2 as pb
from services.state import runs
from services.state.store import Mutation, Store, snapshot_bytes

Key = tuple[str, str]


class MemoryStore(Store):
    def __init__(self, clock: Callable[[], float] | None = None, follow_poll_s: float = 1.0) -> None:
        super().__init__(**({"clock": clock} if clock else {}), follow_poll_s=follow_poll_s)
        self._data: dict[str, bytes] = {}
        # Serialized, like Redis: callers never share a message with the store.
        self._responses: dict[Key, bytes] = {}
        self._runs: dict[Key, bytes] = {}
        self._events: dict[Key, list[pb.RunEvent]] = {}
        self._changed: dict[Key, asyncio.Condition] = {}

    # ---- blobs ----
    async def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    async def put(self, key: str, value: bytes) -> None:
        self._data[key] = value

    async def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    # ---- responses ----
    async def put_response(self, response: pb.StoredResponse, create_only: bool = False) -> None:
        key = (response.key.identity, response.key.response_id)
        if create_only and key in self._responses:
            raise runs.already_exists(key[1])
        self._responses[key] = snapshot_bytes(response, self.clock())

    async def delete_response(self, identity: str, response_id: str) -> bool:
        key = (identity, response_id)
        existed = self._responses.pop(key, None) is not None
        existed = self._runs.pop(key, None) is not None or existed
        self._events.pop(key, None)
        await self._notify(key, forget=True)  # followers end with NOT_FOUND
        return existed

    async def _load(self, identity: str, response_id: str) -> tuple[pb.StoredResponse | None, pb.StoredRun | None]:
        data, run = self._responses.get((identity, response_id)), self._runs.get((identity, response_id))
        return (pb.StoredResponse.FromString(data) if data is not None else None,
                pb.StoredRun.FromString(run) if run is not None else None)

    async def _load_run(self, identity: str, response_id: str) -> pb.StoredRun | None:
        run = self._runs.get((identity, response_id))
        return pb.StoredRun.FromString(run) if run is not None else None

    # ---- runs ----
    async def _create_run(self, identity: str, response_id: str, response: bytes, run: pb.StoredRun) -> None:
        key = (identity, response_id)
        if key in self._responses or key in self._runs:
            raise runs.already_exists(response_id)
        run_bytes = run.SerializeToString()
        self._responses[key], self._runs[key], self._events[key] = response, run_bytes, []

    async def _update_run(self, identity: str, response_id: str, mutate: Mutation) -> pb.RunStatusRecord:
        key = (identity, response_id)
        stored = await self._load_run(identity, response_id)
        if stored is None:
            raise runs.not_found(identity, response_id)
        write = mutate(stored, self.clock())  # may raise: nothing written yet
        if write is None:
            return stored.record
        run_bytes = write.run.SerializeToString()
        # Commit: plain assignments, no await, nothing left that can fail halfway.
        if write.response is not None:
            self._responses[key] = write.response
        self._events.setdefault(key, []).extend(write.events)
        self._runs[key] = run_bytes
        await self._notify(key, forget=write.run.record.status in runs.FINISHED)
        return write.run.record

    async def _expired_candidates(self, now: float, limit: int) -> list[tuple[str, str]]:
        return [key for key, data in self._runs.items()
                if runs.is_expired(pb.StoredRun.FromString(data).record, now)][:limit]

    # ---- events ----
    async def _events_after(self, identity: str, response_id: str, after: int, limit: int) -> list[pb.RunEvent]:
        # Sequences run 1, 2, 3... so event n sits at index n - 1.
        return self._events.get((identity, response_id), [])[after:after + limit]

    async def _wait_events(self, identity: str, response_id: str, after: int, timeout_s: float) -> list[pb.RunEvent]:
        key = (identity, response_id)
        changed = self._changed.setdefault(key, asyncio.Condition())
        async with changed:
            # Checked under the condition's lock with no await before wait(): no lost wake-up.
            if len(self._events.get(key, [])) <= after:
                try:
                    await asyncio.wait_for(changed.wait(), timeout_s)
                except TimeoutError:
                    pass
        if key not in self._runs:
            self._changed.pop(key, None)  # deleted (or never there): nobody will notify it
        return await self._events_after(identity, response_id, after, 256)

    async def _notify(self, key: Key, forget: bool) -> None:
        # `forget` once nothing will change again (finished, deleted): the followers waiting now
        # are woken, later ones see the run finished or gone (at worst after one poll), so the
        # condition can go.
        changed = self._changed.pop(key, None) if forget else self._changed.get(key)
        if changed is not None:
            async with changed:
                changed.notify_all()
