"""Background responses: the run goes on in this gateway replica after the HTTP request returns.

Its events go to the state service's replay log (sequence = event sequence_number + 1), so any
replica can stream or resume them; the final snapshot, status and terminal event are written in
one transaction. The run holds an owner lease it renews while working: if this replica dies, the
lease runs out and the state service reports the run `failed` instead of leaving it in progress.
A cancel (from any replica) wins the status compare-and-set; the runner sees the conflict and
stops, and the engine request is aborted through the worker's `Cancel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from functools import partial
from typing import Any

from mship.state.v1 import state_pb2 as spb
from services.common.routes import RouteTable
from services.gateway.generation import cancel_everywhere
from services.gateway.protocol_common.openai_error import OpenAIError
from services.gateway.responses.mcp_loop import opener, run_mcp_turn
from services.gateway.responses.truncation import open_fitting
from services.gateway.responses.turns import Events, Turn, run_turn
from services.state.client import Conflict, StateClient, StateError

log = logging.getLogger(__name__)
LEASE_S = 10.0
RENEW_EVERY_S = 3.0


def log_event(event: dict[str, Any], terminal: bool = False) -> spb.RunEvent:
    return spb.RunEvent(sequence=event["sequence_number"] + 1, event_json=json.dumps(event), terminal=terminal)


def replayed(event: spb.RunEvent) -> dict[str, Any]:
    """A logged event as the client sees it (the log's numbering is the authority)."""
    data = json.loads(event.event_json)
    data["sequence_number"] = event.sequence - 1
    return data


class RunCancelled(Exception):
    """The run is no longer in progress in the store (cancelled from anywhere)."""


class BackgroundRuns:
    def __init__(self, table: RouteTable, state: StateClient, owner: str) -> None:
        self.table, self.state, self.owner = table, state, owner
        self.tasks: dict[str, asyncio.Task] = {}
        self.cleanups: set[asyncio.Task] = set()  # deletions of runs that did not start

    async def start(self, run: Turn) -> dict[str, Any]:
        """Record the run as queued (answered at once), then work on it in a task."""
        encoder = run.encoder
        queued = encoder.start(queued=True)
        failed = json.loads(json.dumps(encoder.response))
        failed.update(status="failed", error={"code": "server_error",
                                              "message": "The server running this response stopped."})
        await self.state.create_run(run.snapshot(encoder.response), owner=self.owner, lease_s=LEASE_S,
                                    failure_event_json=json.dumps({"type": "response.failed", "sequence_number": 0,
                                                                   "response": failed}))
        try:
            await self.state.append_events(run.identity, encoder.id, [log_event(e) for e in queued],
                                           owner=self.owner)
        except BaseException:  # its client gets an error and no id: leave no queued run behind
            self._discard(run.identity, encoder.id)
            raise
        self.tasks[encoder.id] = asyncio.get_running_loop().create_task(self._run(run))
        self.tasks[encoder.id].add_done_callback(lambda _: self.tasks.pop(encoder.id, None))
        return encoder.response

    def _discard(self, identity: str, rid: str) -> None:
        """Delete a run whose start failed, best effort (failing that, its lease fails it), in a
        task of its own: a cancelled start (its client gone) still deletes it, and the error the
        client gets does not wait for the deletion."""
        cleanup = asyncio.get_running_loop().create_task(self._delete(identity, rid))
        self.cleanups.add(cleanup)
        cleanup.add_done_callback(self.cleanups.discard)

    async def _delete(self, identity: str, rid: str) -> None:
        try:
            await self.state.delete_response(identity, rid)
        except StateError as e:
            log.warning("background response %s did not start and could not be deleted (its lease will fail it): %s",
                        rid, e)

    async def _run(self, run: Turn) -> None:
        encoder, rid = run.encoder, run.encoder.id
        renewer = None
        try:
            await self.state.set_run_status(run.identity, rid, spb.RUN_STATUS_IN_PROGRESS,
                                            expected=[spb.RUN_STATUS_QUEUED], owner=self.owner, lease_s=LEASE_S)
            await self._append(run, encoder.in_progress())
            renewer = asyncio.get_running_loop().create_task(self._renew(run, asyncio.current_task()))
            async with contextlib.aclosing(await self._events(run)) as turn:
                async for events in turn:
                    await self._append(run, events)
        except (Conflict, RunCancelled):
            log.info("background response %s was cancelled", rid)  # a cancel won: stop, write nothing
        except StateError as e:  # the store is gone: the lease will expire and report the run failed
            log.warning("background response %s lost the state store: %s", rid, e)
        except asyncio.CancelledError:
            log.info("background response %s stopped", rid)
        except Exception:  # its lease expires and reports it failed; say which run and why here
            log.exception("background response %s failed", rid)
        finally:
            if renewer is not None:
                renewer.cancel()
            run.ticket.settle(0)  # a run that never opened its generation gives its reservation back

    async def _events(self, run: Turn) -> AsyncGenerator[Events, None]:
        finish = partial(self._finish, run)
        if run.runs_tools:  # the MCP tool loop opens its own generations
            return run_mcp_turn(run, opener(self.table, run), finish, before_call=partial(self._still_running, run))
        try:
            generation = await open_fitting(self.table, run, run.infer, run.ticket)  # (truncation "auto")
        except OpenAIError as e:
            await self._finish(run, run.encoder.error_out(e))
            return _nothing()
        return run_turn(run.encoder, generation, finish)

    async def _still_running(self, run: Turn) -> None:
        """Before each MCP call: a run cancelled from another replica makes no call after the cancel
        (this replica's lease renewal would notice only within RENEW_EVERY_S)."""
        snapshot = await self.state.get_response(run.identity, run.encoder.id)
        if snapshot.run.status != spb.RUN_STATUS_IN_PROGRESS:
            raise RunCancelled(run.encoder.id)

    async def _append(self, run: Turn, events: Events) -> None:
        if events:
            await self.state.append_events(run.identity, run.encoder.id, [log_event(e) for e in events],
                                           owner=self.owner)

    async def _finish(self, run: Turn, events: Events) -> Events:
        """Everything but the terminal event to the log; then snapshot + status + terminal at once.
        Nothing is left to send: a background run's client reads the log."""
        *body, terminal = events
        await self._append(run, body)
        status = getattr(spb, "RUN_STATUS_" + run.encoder.status.upper())
        await self.state.finish_run(run.identity, run.encoder.id, status, owner=self.owner,
                                    response=run.snapshot(run.encoder.response),
                                    events=[log_event(terminal, terminal=True)])
        return []

    async def _renew(self, run: Turn, worker: asyncio.Task | None) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            try:
                await self.state.renew_run(run.identity, run.encoder.id, self.owner, LEASE_S)
            except Conflict:  # cancelled (or finished elsewhere): stop the work
                if worker is not None:
                    worker.cancel()
                return
            except StateError as e:
                log.warning("renewing %s failed: %s", run.encoder.id, e)

    async def abort(self, response_id: str, model: str) -> None:
        """Stop a run's engine work: the local task if it runs here, and `Cancel` on every replica
        of the model, wherever the run lives."""
        task = self.tasks.get(response_id)
        if task is not None:
            task.cancel()
        await cancel_everywhere(self.table, model, [response_id])

    async def stop(self) -> None:
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


async def _nothing() -> AsyncGenerator[Events, None]:
    """A run that ended before it began (its generation could not start): nothing more to send."""
    return
    yield
