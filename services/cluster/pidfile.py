"""`mship start`'s pidfile, one per coordinator port: the process `mship stop` signals.

A pid alone names whichever process has it now. After a `mship start` that ended without its
cleanup (SIGKILL, the OOM killer, a host crash) the pid may belong to anything, so the record also
keeps the process's start time: a live process with that pid and that start time is the one that
wrote it. The file is replaced atomically, so a reader never sees it half written.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from services.common.vocabulary import ENV_CACHE_DIR

# psutil's start times tick in 1/100 s (Linux clock ticks): a reused pid starting in the same
# tick as the dead process is not a case to plan for.
SAME_START_S = 0.01


class PidfileHeld(RuntimeError):
    """Another live `mship start` holds this coordinator port's pidfile."""


@dataclass(frozen=True)
class PidRecord:
    pid: int
    stop_timeout_s: float | None  # its --stop-timeout: how long `mship stop` waits
    started: float | None  # the process's start time (psutil's create_time); None: an older mship wrote it

    def line(self) -> str:
        return " ".join(repr(v) for v in (self.pid, self.stop_timeout_s, self.started) if v is not None) + "\n"


def pidfile(coordinator: str) -> Path:
    """Where `mship start` leaves its pid, per coordinator port: several platforms may share a host."""
    root = Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "mship")
    return root / "run" / f"mship-start-{coordinator.rsplit(':', 1)[-1]}.pid"


def read_pidfile(path: Path) -> PidRecord:
    """The record in `path`; OSError when there is none, ValueError when it is empty or garbled."""
    fields = path.read_text().split()
    if not 1 <= len(fields) <= 3:
        raise ValueError(f"{path}: expected `PID [STOP_TIMEOUT [START_TIME]]`, got {len(fields)} fields")
    return PidRecord(int(fields[0]), float(fields[1]) if len(fields) > 1 else None,
                     float(fields[2]) if len(fields) > 2 else None)


def own_record(stop_timeout_s: float) -> PidRecord:
    return PidRecord(os.getpid(), stop_timeout_s, psutil.Process().create_time())


def write_pidfile(path: Path, record: PidRecord) -> None:
    """Atomically (a temporary file renamed over it): a reader sees the old record or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(record.line())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def running_start(record: PidRecord) -> psutil.Process | None:
    """The live `mship start` the record names, or None: the process is gone, or its pid now
    belongs to another process (a different start time; without one recorded, not a `mship start`)."""
    try:
        proc = psutil.Process(record.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # exited; only its parent's reaping is left
            return None
        if record.started is not None:
            return proc if abs(proc.create_time() - record.started) < SAME_START_S else None
        return proc if is_mship_start(proc.cmdline()) else None
    except psutil.Error:  # gone, or not ours to look at
        return None


def is_mship_start(cmdline: list[str]) -> bool:
    """`mship start ...` or `python -m clients.cli start ...` (a record of an older mship has no start time)."""
    for i, arg in enumerate(cmdline):
        if os.path.basename(arg) == "mship" or (arg == "clients.cli" and i and cmdline[i - 1] == "-m"):
            return "start" in cmdline[i + 1:]
    return False


def claim_pidfile(path: Path, stop_timeout_s: float) -> PidRecord:
    """Write this process's record, unless a live `mship start` holds the file (PidfileHeld)."""
    with contextlib.suppress(OSError, ValueError):  # none, or unreadable: nobody's to keep
        held = read_pidfile(path)
        if held.pid != os.getpid() and (other := running_start(held)) is not None:
            raise PidfileHeld(f"another `mship start` (pid {other.pid}) runs for this coordinator port ({path}); "
                              "stop it first (`mship stop`), or move this one with --coordinator-port")
    record = own_record(stop_timeout_s)
    write_pidfile(path, record)
    return record


def release_pidfile(path: Path, record: PidRecord) -> bool:
    """Remove the file if it still holds `record` (another start may have replaced it since); True if removed."""
    with contextlib.suppress(OSError, ValueError):
        if read_pidfile(path) == record:
            path.unlink()
            return True
    return False
