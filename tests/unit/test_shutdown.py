"""The stop is bounded: `Platform.stop` over a fake Serve/Ray that hangs, real child processes that
ignore SIGTERM, the Ray node's process group, the signals of a foreground command and `mship stop`
itself all end within their deadline, and say what they had to force."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from clients.cli import main
from clients.modelset import ConfigError
from clients.node_commands import join_stop_timeout
from services import launcher
from services.cluster.pidfile import PidRecord, is_mship_start, pidfile, write_pidfile
from services.cluster.ray_node import NodeConfig, RayNode
from services.cluster.shutdown import StopRequested, StopSignals
from services.launcher import Platform, PlatformConfig

REPLICA = "mship-gateway#GatewayDeployment#abc123"
# A child that ignores SIGTERM (as a replica stuck in a drain would) and says when it does.
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); signal.pause()"
POLITE = "import signal; print('ready', flush=True); signal.pause()"


def child(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler is in place
    return proc


class FakeRay:
    """Serve and Ray as `Platform.stop` sees them: a drain that waits for `release` (never set
    unless the kill sets it), a kill of Serve's actors, a disconnect."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, drain_finishes: bool = False, kill_releases: bool = True,
                 processes: list[psutil.Process] | None = None) -> None:
        self.started, self.release, self.disconnected = threading.Event(), threading.Event(), threading.Event()
        self.kills = 0
        self.drain_finishes, self.kill_releases = drain_finishes, kill_releases
        monkeypatch.setattr(launcher, "_ray_connected", lambda: True)
        monkeypatch.setattr(launcher, "_drain_serve", self.drain)
        monkeypatch.setattr(launcher, "_kill_serve_actors", self.kill)
        monkeypatch.setattr(launcher, "_disconnect_ray", self.disconnected.set)
        monkeypatch.setattr(launcher, "_our_processes", lambda: processes or [])

    def drain(self, budget_s: float) -> bool:
        self.started.set()
        if self.drain_finishes:
            return True
        self.release.wait()  # a replica that never finishes its __del__, until it is killed
        return False

    def kill(self) -> tuple[list[str], bool]:
        self.kills += 1
        if self.kill_releases:
            self.release.set()  # a killed controller ends the drain's Ray call
        return [REPLICA], True


def platform() -> Platform:
    return Platform(PlatformConfig(ray_address="auto"))  # attached: no head node of its own


def timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - t0


def test_a_serve_stop_that_hangs_is_cut_at_the_deadline_and_the_killed_replicas_named(monkeypatch):
    ray = FakeRay(monkeypatch)
    deadline, took = timed(platform().stop, 2.0)
    assert 1.4 < took < 3.0  # the drain had its share of the 2 s (all but the reserve), no more
    assert ray.kills == 1 and ray.disconnected.is_set() and deadline.stuck == []
    line = deadline.summary()
    assert line is not None and line.startswith("stop forced after ") and "(the 2s stop timeout)" in line
    assert f"killed 1 replica actor ({REPLICA}) and Serve's controller" in line


def test_a_drain_that_finishes_in_time_forces_nothing(monkeypatch):
    ray = FakeRay(monkeypatch, drain_finishes=True)
    deadline, took = timed(platform().stop, 30.0)
    assert took < 2.0 and ray.kills == 0 and ray.disconnected.is_set()
    assert deadline.summary() is None


def test_a_second_signal_skips_the_drain_at_once(monkeypatch):
    ray = FakeRay(monkeypatch)
    hurry = threading.Event()
    threading.Thread(target=lambda: ray.started.wait(10) and hurry.set(), daemon=True).start()
    deadline, took = timed(platform().stop, 60.0, hurry)
    assert took < 3.0 and ray.kills == 1
    line = deadline.summary()
    assert line is not None and "(a second signal)" in line and REPLICA in line


def test_a_ray_call_that_never_returns_is_left_behind_and_ray_left_alone(monkeypatch):
    monkeypatch.setattr(launcher, "KILL_STEP_S", 0.5)
    ray = FakeRay(monkeypatch, kill_releases=False)
    try:
        deadline, took = timed(platform().stop, 2.0)
        assert took < 2.0 + 2 * 0.5 + 1.0  # the deadline, then each forced step its own bound
        assert deadline.stuck == ["Serve's shutdown"] and not ray.disconnected.is_set()  # no ray.shutdown under it
        assert "left running: Serve's shutdown" in (deadline.summary() or "")
    finally:
        ray.release.set()


def test_processes_that_ignore_sigterm_are_sigkilled_and_named(monkeypatch):
    stubborn, polite = child(STUBBORN), child(POLITE)
    FakeRay(monkeypatch, drain_finishes=True, processes=[psutil.Process(stubborn.pid), psutil.Process(polite.pid)])
    deadline, took = timed(platform().stop, 1.5)
    assert took < 1.5 + 1.0
    assert not psutil.pid_exists(stubborn.pid) and not psutil.pid_exists(polite.pid)  # ended, and reaped
    assert deadline.killed_pids == [stubborn.pid]  # the polite one ended on its SIGTERM
    assert f"SIGKILLed pid {stubborn.pid}" in (deadline.summary() or "")


def test_processes_that_stop_on_sigterm_are_not_reported(monkeypatch):
    polite = child(POLITE)
    FakeRay(monkeypatch, drain_finishes=True, processes=[psutil.Process(polite.pid)])
    deadline, took = timed(platform().stop, 30.0)
    assert took < 2.0 and not psutil.pid_exists(polite.pid) and deadline.summary() is None


def test_a_start_interrupted_inside_ray_init_exits_hard(monkeypatch):
    """Ray loaded but not connected (a signal inside ray.init): Ray's exit hook would crash on it."""
    FakeRay(monkeypatch)
    monkeypatch.setattr(launcher, "_ray_connected", lambda: False)
    monkeypatch.setattr(launcher, "_ray_loaded", lambda: True)
    deadline = platform().stop(30.0)
    assert deadline.exit_hard and deadline.summary() is None


def running(pid: int) -> bool:
    """Alive and not a zombie; a pid reaped while it is asked about is not running."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def fake_node(monkeypatch: pytest.MonkeyPatch, leader: str) -> RayNode:
    """A RayNode whose `ray start` is `leader` (with a child of its own in its process group)."""
    script = ("import subprocess, sys, signal\n" + leader + "\n"
              f"subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], stdout=subprocess.DEVNULL)\n"
              "print('Ray runtime started', flush=True)\nsignal.pause()\n")
    monkeypatch.setattr(NodeConfig, "command", lambda self: [sys.executable, "-c", script])
    node = RayNode(NodeConfig(head=False, gcs_address="127.0.0.1:1"), env=dict(os.environ))
    node.wait_started(30)
    return node


def test_a_node_that_does_not_leave_in_its_grace_is_sigkilled_with_its_group(monkeypatch):
    node = fake_node(monkeypatch, "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    group = node._group()
    assert len(group) == 2 and node.proc.pid in group
    killed, took = timed(node.stop, 1.0)
    assert 0.9 < took < 3.0 and sorted(killed) == sorted(group)
    assert node.proc.returncode == -signal.SIGKILL and not any(running(p) for p in group)


def test_a_second_signal_ends_a_node_grace_at_once(monkeypatch):
    node = fake_node(monkeypatch, "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    hurry = threading.Event()
    hurry.set()
    killed, took = timed(node.stop, 60.0, hurry)
    assert took < 3.0 and node.proc.pid in killed


def test_a_node_that_leaves_in_time_reports_nothing_forced(monkeypatch):
    node = fake_node(monkeypatch, "")  # `ray start` ends on SIGTERM; its leftover child is routine cleanup
    killed, took = timed(node.stop, 30.0)
    assert killed == [] and took < 3.0 and node.proc.returncode == -signal.SIGTERM


@pytest.fixture
def signals() -> Iterator[StopSignals]:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield StopSignals()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_the_first_signal_stops_a_later_one_hurries(signals, capfd):
    os.kill(os.getpid(), signal.SIGTERM)
    assert signals.stop.wait(5) and not signals.hurry.is_set()
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.hurry.wait(5)
    assert "a second signal: forcing the stop" in capfd.readouterr().err


def test_a_signal_while_starting_interrupts_the_start(signals):
    with pytest.raises(StopRequested), signals.interrupting():
        os.kill(os.getpid(), signal.SIGINT)
        signals.hurry.wait(5)  # a start blocked in a wait: the handler raises inside it
    assert signals.stop.is_set() and not signals.hurry.is_set()
    with pytest.raises(StopRequested), signals.interrupting():  # a stop already asked for: at once
        pass


def test_join_stop_timeout_covers_the_drain():
    def parsed(*flags: str):
        from clients.cli import parser
        return parser().parse_args(["join", "--gcs-address", "h:1", *flags])

    assert join_stop_timeout(parsed()) == 60
    assert join_stop_timeout(parsed("--drain-timeout", "90")) == 120
    assert join_stop_timeout(parsed("--stop-timeout", "40")) == 40
    with pytest.raises(ConfigError, match="--drain-timeout"):
        join_stop_timeout(parsed("--stop-timeout", "10"))


COORDINATOR = "127.0.0.1:50999"


def run_stop(*flags: str) -> tuple[int, float]:
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as done:
        main(["stop", "--coordinator", COORDINATOR, *flags])
    return int(done.value.code), time.monotonic() - t0


def record_of(proc: subprocess.Popen) -> PidRecord:
    """The pidfile record `mship start` writes, for a stand-in child."""
    return PidRecord(proc.pid, 60.0, psutil.Process(proc.pid).create_time())


def test_mship_stop_is_bounded_and_says_the_platform_is_still_stopping(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MSHIP_CACHE_DIR", str(tmp_path))
    pid = pidfile(COORDINATOR)
    pid.parent.mkdir(parents=True)
    assert run_stop()[0] == 3  # nothing running
    stubborn = child(STUBBORN)
    try:
        write_pidfile(pid, record_of(stubborn))
        code, took = run_stop("--timeout", "0.5")
        assert code == 5 and took < 2.0
        assert f"(pid {stubborn.pid}) is still stopping after 0.5s" in capsys.readouterr().err
    finally:
        stubborn.kill()
        stubborn.wait()
    polite = child(POLITE)
    write_pidfile(pid, record_of(polite))  # waits up to 75 s, returns as soon as it has stopped
    code, took = run_stop()
    assert code == 0 and took < 3.0 and "mship stopped" in capsys.readouterr().out
    polite.wait(5)


def test_mship_stop_leaves_a_process_that_took_a_dead_starts_pid_alone(tmp_path, monkeypatch, capsys):
    """A start killed without its cleanup leaves its pidfile; the pid may be any process's by now."""
    monkeypatch.setenv("MSHIP_CACHE_DIR", str(tmp_path))
    pid = pidfile(COORDINATOR)
    other = child(POLITE)  # not a `mship start`: it must not be signalled
    try:
        started = record_of(other).started
        assert started is not None
        for stale in (f"{other.pid} 60\n",  # an older mship's record: no start time, and not `mship start`
                      f"{other.pid} 60.0 {started - 5!r}\n"):  # the pid's process started later than the record's
            pid.parent.mkdir(parents=True, exist_ok=True)
            pid.write_text(stale)
            assert run_stop("--timeout", "1")[0] == 3
            assert "is stale" in capsys.readouterr().err and not pid.exists()
            assert other.poll() is None  # still running: never signalled
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("text", ["", "\n", "not-a-pid 60\n", "1 2 3 4\n"])
def test_mship_stop_with_an_unreadable_pidfile_says_none_runs(tmp_path, monkeypatch, capsys, text):
    monkeypatch.setenv("MSHIP_CACHE_DIR", str(tmp_path))
    pid = pidfile(COORDINATOR)
    pid.parent.mkdir(parents=True)
    pid.write_text(text)  # e.g. a start killed mid-write by an older mship, or a full disk
    assert run_stop()[0] == 3
    assert "no running `mship start` found" in capsys.readouterr().err and not pid.exists()


def test_an_older_mships_record_of_a_running_start_is_still_recognised():
    assert is_mship_start(["/venv/bin/python", "/venv/bin/mship", "start", "--config", "m.yaml"])
    assert is_mship_start(["python3", "-m", "clients.cli", "--coordinator", "h:1", "start"])
    assert not is_mship_start(["sleep", "1000"]) and not is_mship_start(["/venv/bin/mship", "stop"])
    assert not is_mship_start(["python", "-c", "print('clients.cli start')"])
