"""`mship start` in this process over a stand-in platform (nothing of Ray starts) and a real gRPC
coordinator stand-in: a signal while the initial deploy is followed stops the platform, a broken
deploy stream leaves it running, and the pidfile belongs to the start that runs."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import psutil
import pytest

from clients import cli
from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services import launcher
from services.cluster import ports
from services.cluster.pidfile import PidRecord, pidfile, read_pidfile, write_pidfile
from services.common.channels import sync_channel
from services.common.vocabulary import ENV_CACHE_DIR, ENV_NODE_CAPABILITIES
from tests.platform_process import free_port
from tests.unit.test_shutdown import POLITE, child

pytestmark = pytest.mark.timeout(60)
WAIT_S = 20.0  # bounds each wait below; a correct run takes well under a second


class FakePlatform:
    """Platform as `mship start` drives it; `on_start` runs inside `start`."""

    started = threading.Event()
    stopped = threading.Event()
    on_start: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, cfg: launcher.PlatformConfig) -> None:
        self.cfg = cfg

    def start(self) -> None:
        ports.check_free(self.cfg.ports())  # as Platform.start does first
        FakePlatform.started.set()
        FakePlatform.on_start()

    def stop(self, timeout_s: float = 60, hurry: threading.Event | None = None) -> launcher.StopDeadline:
        FakePlatform.stopped.set()
        return launcher.StopDeadline(timeout_s, hurry)


@pytest.fixture
def fake_platform(tmp_path, monkeypatch) -> Iterator[type[FakePlatform]]:
    """A stand-in platform, the pidfile under tmp_path, and this process's signal handlers restored."""
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_NODE_CAPABILITIES, "[]")
    monkeypatch.setattr(launcher, "Platform", FakePlatform)
    FakePlatform.started, FakePlatform.stopped = threading.Event(), threading.Event()
    monkeypatch.setattr(FakePlatform, "on_start", staticmethod(lambda: None))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield FakePlatform
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


PORT_FLAGS = ("--http-port", "--coordinator-port", "--state-port", "--gcs-port")


def start(*argv: str) -> int:
    """`mship start` on free ports, each picked outside the kernel's ephemeral range unless `argv` names
    it: the defaults (50051, 50052) lie inside it, where any process connecting out meanwhile (the
    integration tier's platforms still run) may hold one."""
    picked = [arg for flag in PORT_FLAGS if flag not in argv for arg in (flag, str(free_port()))]
    with pytest.raises(SystemExit) as done:
        cli.main(["start", "--no-metrics", *picked, *argv])
    return int(done.value.code)


class Coordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """One progress event, then either a broken stream (`abort_with`) or a load that lasts until the
    caller goes away."""

    def __init__(self, abort_with: grpc.StatusCode | None = None) -> None:
        self.abort_with = abort_with
        self.caller_left = threading.Event()

    def Deploy(self, request, context):
        context.add_callback(self.caller_left.set)
        yield pb.DeployEvent(deploy_id="d-7", state=pb.DEPLOY_STATE_RUNNING, message="loading")
        if self.abort_with is not None:
            context.abort(self.abort_with, "the coordinator replica restarted")
        self.caller_left.wait(WAIT_S)


@pytest.fixture
def coordinator(monkeypatch) -> Iterator[Callable[..., Coordinator]]:
    """Serves a Coordinator on a real gRPC port; `mship start`'s initial deploy dials it."""
    servers = []

    def serve(**kwargs) -> Coordinator:
        servicer = Coordinator(**kwargs)
        server = grpc.server(futures.ThreadPoolExecutor(4))
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        monkeypatch.setattr(cli, "_stub", lambda args: (ch := sync_channel(f"127.0.0.1:{port}"),
                                                        coordinator_pb2_grpc.CoordinatorStub(ch)))
        return servicer

    try:
        yield serve
    finally:
        for server in servers:
            server.stop(0)


def signal_when(event: threading.Event, then: Callable[[], None] = lambda: None) -> threading.Thread:
    """SIGTERM to this process once `event` is set (on the main thread, as a supervisor's would be)."""
    def run() -> None:
        if event.wait(WAIT_S):
            os.kill(os.getpid(), signal.SIGTERM)
            then()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_signal_while_the_initial_deploy_is_followed_stops_the_platform(fake_platform, coordinator, monkeypatch,
                                                                         capsys):
    deploy = coordinator()
    following = threading.Event()
    follow = cli.follow_deploy

    def first_event_seen(events, out=None):  # the CLI has its first event: it is following the deploy
        def tell():
            for event in events:
                yield event
                following.set()
        return follow(tell(), **({"out": out} if out else {}))

    monkeypatch.setattr(cli, "follow_deploy", first_event_seen)
    sent = []

    def second_if_ignored() -> None:  # (only when the first one was lost: end the test, not hang it)
        sent.append(1)
        if not fake_platform.stopped.wait(WAIT_S / 2):
            sent.append(2)
            os.kill(os.getpid(), signal.SIGTERM)

    thread = signal_when(following, second_if_ignored)
    assert start("--model", "builtin:gemma-3-270m") == 0
    thread.join(WAIT_S)
    out, err = capsys.readouterr()
    assert sent == [1], "the first SIGTERM did not stop the platform"
    assert "stopped following" not in err and "initial deploy failed" not in err and "OpenAI API at" not in out
    assert deploy.caller_left.wait(5)  # its deploy stream was closed


def test_a_broken_initial_deploy_stream_leaves_the_platform_running(fake_platform, coordinator, monkeypatch, capsys):
    coordinator(abort_with=grpc.StatusCode.UNAVAILABLE)
    serving = threading.Event()
    monkeypatch.setattr(launcher, "edge_access", lambda: serving.set() or "open")  # printed once it serves
    thread = signal_when(serving)
    assert start("--model", "builtin:gemma-3-270m") == 0
    thread.join(WAIT_S)
    out, err = capsys.readouterr()
    assert serving.is_set() and "OpenAI API at" in out, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("mship:")]
    assert "the initial deploy failed" in line and "UNAVAILABLE" in line and "the platform keeps running" in line


def live_start_record(proc: psutil.Process) -> PidRecord:
    return PidRecord(proc.pid, 60.0, proc.create_time())


def test_a_start_on_taken_ports_leaves_the_running_platforms_pidfile(fake_platform, capsys):
    running = child(POLITE)  # stands in for the running `mship start` that wrote the pidfile
    try:
        with socket.socket() as taken:
            port = free_port()  # outside the ephemeral range: nobody else takes it once this socket closes
            taken.bind(("127.0.0.1", port))
            taken.listen()
            path = pidfile(f"127.0.0.1:{port}")
            record = live_start_record(psutil.Process(running.pid))
            write_pidfile(path, record)
            assert start("--coordinator-port", str(port)) == 5
        assert "--coordinator-port" in capsys.readouterr().err
        assert read_pidfile(path) == record and not fake_platform.started.is_set()
        # Its ports free (the first start still starting), the second start still leaves its pidfile.
        fake_platform.on_start = staticmethod(lambda: pytest.fail("started beside a running `mship start`"))
        assert start("--coordinator-port", str(port)) == 5
        assert f"another `mship start` (pid {running.pid})" in capsys.readouterr().err
        assert read_pidfile(path) == record and not fake_platform.started.is_set()
    finally:
        running.kill()
        running.wait()


def test_a_start_removes_only_its_own_pidfile(fake_platform):
    port = free_port()
    path = pidfile(f"127.0.0.1:{port}")
    other = PidRecord(os.getpid() + 1, 60.0, 1.0)  # a later start's, written over ours meanwhile

    def replaced_then_stopped() -> None:
        write_pidfile(path, other)
        os.kill(os.getpid(), signal.SIGTERM)  # stops this start while it starts

    fake_platform.on_start = staticmethod(replaced_then_stopped)
    assert start("--coordinator-port", str(port)) == 0 and fake_platform.stopped.is_set()
    assert read_pidfile(path) == other
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.parametrize("variable", ["MSHIP_STREAM_DRAIN_S", "MSHIP_STATE_RETENTION_S"])
def test_a_replica_duration_that_is_no_duration_stops_the_start_before_anything_starts(fake_platform, monkeypatch,
                                                                                       capsys, variable):
    monkeypatch.setenv(variable, "ten minutes")
    assert start() == 2
    err = capsys.readouterr().err
    assert f"{variable}: 'ten minutes': give seconds" in err and err.count(variable) == 1, err
    assert not fake_platform.started.is_set()


def test_a_proxy_list_with_a_typo_stops_the_start_before_anything_starts(fake_platform, monkeypatch, capsys):
    """uvicorn would take the typo for a host name and believe no proxy: refused here, named."""
    monkeypatch.setenv("MSHIP_FORWARDED_ALLOW_IPS", "10.0.0.0/8,10.0.0.300")
    assert start() == 2
    err = capsys.readouterr().err
    assert "MSHIP_FORWARDED_ALLOW_IPS: '10.0.0.0/8,10.0.0.300': '10.0.0.300' is not an IP address" in err, err
    assert not fake_platform.started.is_set()


def test_a_connection_cap_that_is_no_number_stops_the_start_before_anything_starts(fake_platform, monkeypatch,
                                                                                   capsys):
    monkeypatch.setenv("MSHIP_MAX_CONNECTIONS", "-5")
    assert start() == 2
    err = capsys.readouterr().err
    assert "MSHIP_MAX_CONNECTIONS: '-5': give a whole number" in err and err.count("MSHIP_MAX_CONNECTIONS") == 1, err
    assert not fake_platform.started.is_set()
