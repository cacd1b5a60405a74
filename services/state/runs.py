"""The background-run state machine, as pure functions on records: both backends apply these
inside one transaction, so the memory and Redis stores cannot disagree on the rules.

Rules: a finished run (completed, incomplete, failed, cancelled) never changes again; an unfinished
run whose owner's lease has passed is FAILED once anyone reads or sweeps it; events are numbered
1, 2, 3... with no gap and no repeat, and the terminal event comes with the final status.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import grpc

from mship.state.v1 import state_pb2 as pb
from services.common.errors import Reason, ServiceError

ACTIVE = frozenset({pb.RUN_STATUS_QUEUED, pb.RUN_STATUS_IN_PROGRESS})
FINISHED = frozenset({pb.RUN_STATUS_COMPLETED, pb.RUN_STATUS_INCOMPLETE, pb.RUN_STATUS_FAILED,
                      pb.RUN_STATUS_CANCELLED})
LEASE_EXPIRED = "the gateway replica running this response stopped (its lease expired)"


def not_found(identity: str, response_id: str) -> ServiceError:
    # The same answer whether the id is unknown or another identity's: nothing leaks.
    return ServiceError(grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND, f"no response {response_id!r}",
                        metadata={"response_id": response_id})


def already_exists(response_id: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.ALREADY_EXISTS, Reason.CONFLICT, f"response {response_id!r} already exists")


def conflict(message: str, run: pb.RunStatusRecord) -> ServiceError:
    """A lost compare-and-set; the metadata says where the run is now."""
    return ServiceError(grpc.StatusCode.ABORTED, Reason.CONFLICT, message, metadata={
        "status": pb.RunStatus.Name(run.status), "owner": run.owner, "last_sequence": str(run.last_sequence)})


def is_expired(run: pb.RunStatusRecord, now: float) -> bool:
    return run.status in ACTIVE and 0 < run.owner_expires_at <= now


def new_run(key: pb.ResponseKey, status: int, owner: str, lease_s: float, now: float) -> pb.RunStatusRecord:
    return pb.RunStatusRecord(key=key, status=status or pb.RUN_STATUS_QUEUED, owner=owner, created_at=now,
                              updated_at=now, owner_expires_at=now + lease_s if lease_s > 0 else 0.0)


def _check_transition(run: pb.RunStatusRecord, expected: Iterable[int], owner: str | None) -> None:
    name = pb.RunStatus.Name(run.status)
    if run.status in FINISHED:
        raise conflict(f"the run is already finished ({name})", run)
    allowed = set(expected)
    if allowed and run.status not in allowed:
        raise conflict(f"the run is {name}, not one of {sorted(pb.RunStatus.Name(s) for s in allowed)}", run)
    if owner and run.owner != owner:
        raise conflict(f"the run is owned by {run.owner!r}", run)


def set_status(run: pb.RunStatusRecord, now: float, status: int, expected: Iterable[int], owner: str,
               lease_s: float) -> pb.RunStatusRecord:
    _check_transition(run, expected, None)
    out = pb.RunStatusRecord()
    out.CopyFrom(run)
    out.status, out.updated_at = status, now
    if owner:
        out.owner = owner
    if lease_s > 0:
        out.owner_expires_at = now + lease_s
    if status in FINISHED:
        out.owner_expires_at = 0.0  # nothing left to expire
    return out


def renew(run: pb.RunStatusRecord, now: float, owner: str, lease_s: float) -> pb.RunStatusRecord:
    _check_transition(run, (), owner)
    out = pb.RunStatusRecord()
    out.CopyFrom(run)
    out.owner_expires_at, out.updated_at = now + lease_s, now
    return out


def number_events(run: pb.RunStatusRecord, events: Sequence[pb.RunEvent]) -> list[pb.RunEvent]:
    """The events with their sequences: explicit ones must continue the log exactly (a retried
    append repeats sequences and is refused); all-zero ones are numbered after the last."""
    last = run.last_sequence
    if events and events[0].sequence == 0:
        return [pb.RunEvent(sequence=last + i, event_json=e.event_json, terminal=e.terminal)
                for i, e in enumerate(events, 1)]
    if events and events[0].sequence != last + 1:
        what = "repeats" if events[0].sequence <= last else "leaves a gap after"
        raise conflict(f"the append starting at sequence {events[0].sequence} {what} the log's last, {last}", run)
    return list(events)


def append(run: pb.RunStatusRecord, now: float, events: Sequence[pb.RunEvent],
           owner: str) -> tuple[pb.RunStatusRecord, list[pb.RunEvent]]:
    _check_transition(run, (), owner)
    numbered = number_events(run, events)
    out = pb.RunStatusRecord()
    out.CopyFrom(run)
    if numbered:
        out.last_sequence, out.updated_at = numbered[-1].sequence, now
    return out, numbered


def finish(run: pb.RunStatusRecord, now: float, status: int, expected: Iterable[int], owner: str,
           events: Sequence[pb.RunEvent], detail: str = "") -> tuple[pb.RunStatusRecord, list[pb.RunEvent]]:
    _check_transition(run, expected, owner)
    out, numbered = append(run, now, events, "")
    out.status, out.updated_at, out.owner_expires_at = status, now, 0.0
    if detail:
        out.detail = detail
    return out, numbered


def expire(run: pb.RunStatusRecord, now: float,
           failure_event_json: str) -> tuple[pb.RunStatusRecord, list[pb.RunEvent]]:
    """FAILED with a terminal failure event (so followers end), if the lease has passed."""
    if not is_expired(run, now):
        return run, []
    event = pb.RunEvent(event_json=failure_event_json or default_failure_event(run), terminal=True)
    return finish(run, now, pb.RUN_STATUS_FAILED, (), "", [event], detail=LEASE_EXPIRED)


def default_failure_event(run: pb.RunStatusRecord) -> str:
    return json.dumps({"type": "error", "code": "server_error", "message": LEASE_EXPIRED,
                       "response_id": run.key.response_id})


def validate_events(events: Sequence[pb.RunEvent], path: str, *, allow_terminal: bool) -> list[tuple[str, str]]:
    """Shape checks that need no state: all-zero or strictly contiguous sequences, terminal last."""
    violations: list[tuple[str, str]] = []
    explicit = [e.sequence != 0 for e in events]
    if any(explicit) and not all(explicit):
        violations.append((path, "give every event a sequence, or none (numbered by the state service)"))
    elif all(explicit):
        for i in range(1, len(events)):
            if events[i].sequence != events[i - 1].sequence + 1:
                violations.append((f"{path}[{i}].sequence", "sequences must be contiguous"))
                break
    for i, event in enumerate(events):
        if event.terminal and not allow_terminal:
            violations.append((f"{path}[{i}].terminal", "the terminal event is written by FinishRun"))
        elif event.terminal and i != len(events) - 1:
            violations.append((f"{path}[{i}].terminal", "only the last event may be terminal"))
    return violations
