"""A bounded stop: one deadline for everything `mship start` / `mship join` end, a second signal
that skips to the forced path, and one line naming what the deadline (or that signal) forced.

Every step that may never return (a Ray or Serve call waiting on a dead GCS, a replica that does
not drain) runs on a daemon thread and is waited for only until the deadline; what was killed
instead of stopped is recorded here, so the operator reads exactly what was cut short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil

POLL_S = 0.05
# How soon the main thread sees a signal that came just as it went to sleep: CPython runs a handler
# between bytecodes, so one that arrives after the last check and before the lock wait starts wakes
# nothing until the wait times out (a bare Event.wait() would sleep through it for good).
SIGNAL_CHECK_S = 0.5
KILL_WAIT_S = 2.0  # SIGKILL is not refused: this only bounds waiting for the kernel to reap


class StopRequested(BaseException):
    """Raised by a first signal while a command is starting (BaseException: no `except Exception`
    on the way swallows it, as for KeyboardInterrupt)."""


class StopSignals:
    """SIGINT/SIGTERM for a foreground command: the first asks it to stop (`stop`; raising
    StopRequested inside `interrupting()`), any later one sets `hurry`: the stop skips to killing."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self._interrupting = False
        self.install()

    def install(self) -> None:
        """(Again after ray.init, which puts its own SIGTERM handlers in.)"""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            if not self.hurry.is_set():  # os.write: print() may be mid-write on this very thread
                os.write(2, b"mship: a second signal: forcing the stop\n")
            self.hurry.set()
            return
        self.stop.set()
        if self._interrupting:
            raise StopRequested

    def wait(self) -> None:
        """Until the first signal (on the main thread)."""
        while not self.stop.wait(SIGNAL_CHECK_S):
            pass

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        """A first signal inside raises StopRequested (a start, a wait that may take minutes); one
        that came already raises it on entry."""
        if self.stop.is_set():
            raise StopRequested
        self._interrupting = True
        try:
            yield
        finally:
            self._interrupting = False


class Step:
    """`fn(*args)` on a daemon thread: a call that may never return must not hold the stop."""

    def __init__(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        self.what = what
        self.value: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn, args), name=f"stop: {what}", daemon=True).start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self.value = fn(*args)
        except BaseException as e:  # reported by the caller; a thread must not die silently
            self.error = e
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()


class StopDeadline:
    """One stop's deadline and its record. Waits end at the deadline, or at once when `hurry` is
    set (unless a step is itself the forced path); `summary()` names what was forced."""

    def __init__(self, timeout_s: float, hurry: threading.Event | None = None) -> None:
        self.timeout_s = timeout_s
        self.hurry = hurry if hurry is not None else threading.Event()
        self._t0 = time.monotonic()
        self.killed_replicas: list[str] = []  # Serve replica actors killed instead of drained
        self.killed_controller = False
        self.killed_pids: list[int] = []
        self.stuck: list[str] = []  # steps still running when the stop gave up on them
        # End the process with os._exit: a step still runs, or a library's exit hooks would touch
        # what the stop tore down (and hang or crash).
        self.exit_hard = False

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def remaining(self, reserve_s: float = 0.0) -> float:
        """Seconds left before the deadline (less `reserve_s`); 0 once hurried."""
        if self.hurry.is_set():
            return 0.0
        return max(0.0, self.timeout_s - reserve_s - self.elapsed())

    def wait(self, done: Callable[[], bool], budget_s: float, interruptible: bool = True) -> bool:
        """Poll `done` for up to `budget_s` (less once hurried, if interruptible); its last answer."""
        end = time.monotonic() + budget_s
        while not done():
            if time.monotonic() >= end or (interruptible and self.hurry.is_set()):
                return done()
            if interruptible:
                self.hurry.wait(POLL_S)  # wakes at once on a second signal
            else:
                time.sleep(POLL_S)
        return True

    def run(self, what: str, fn: Callable[..., Any], *args: Any, budget_s: float,
            interruptible: bool = True) -> Step:
        """Start `fn` as a Step and wait for it within `budget_s`; the step (`done` says whether it ended)."""
        step = Step(what, fn, *args)
        self.wait(lambda: step.done, budget_s, interruptible)
        return step

    def give_up(self, step: Step) -> None:
        """The stop goes on without `step`; the process must then not wait for it at exit."""
        self.stuck.append(step.what)
        self.exit_hard = True

    def summary(self) -> str | None:
        """One line of what was forced (None when everything stopped in time, by itself)."""
        parts = []
        if self.killed_replicas or self.killed_controller:
            n = len(self.killed_replicas)
            replicas = f"{n} replica actor{'s' if n != 1 else ''} ({', '.join(self.killed_replicas)})" if n else ""
            controller = "Serve's controller" if self.killed_controller else ""
            parts.append("killed " + " and ".join(x for x in (replicas, controller) if x))
        if self.killed_pids:
            parts.append("SIGKILLed pid" + ("s " if len(self.killed_pids) != 1 else " ") +
                         ", ".join(str(p) for p in sorted(set(self.killed_pids))))
        if self.stuck:
            parts.append("left running: " + ", ".join(self.stuck))
        if not parts:
            return None
        cause = "a second signal" if self.hurry.is_set() else f"the {self.timeout_s:g}s stop timeout"
        return f"stop forced after {self.elapsed():.1f}s ({cause}): " + "; ".join(parts)


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an exited process its parent has not reaped yet has stopped)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_processes(procs: list[psutil.Process], deadline: StopDeadline) -> None:
    """SIGTERM those still running, wait for them until the deadline, SIGKILL the rest (recorded)."""
    running = [p for p in procs if alive(p)]
    for p in running:
        with contextlib.suppress(psutil.Error):
            p.terminate()

    def gone() -> bool:
        nonlocal running
        still = [p for p in running if alive(p)]
        # Reap our own children that exited, zombies included. Filtering after the reap would drop
        # one that exited in between as a zombie nobody reaps.
        psutil.wait_procs(running, timeout=0)
        running = still
        return not running

    if deadline.wait(gone, deadline.remaining()):
        return
    for p in running:
        with contextlib.suppress(psutil.Error):
            p.kill()
            deadline.killed_pids.append(p.pid)
    psutil.wait_procs(running, timeout=KILL_WAIT_S)
