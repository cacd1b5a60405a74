"""The `mship` CLI process against a stand-in coordinator (a real grpc.aio server in the test):
an operator who interrupts `mship deploy --wait` stops following; the deploy is left running. A
coordinator that does not answer `deploy --status/--cancel` or a deploy not followed is given up at
a deadline, and Ctrl-C there is one line, not a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from clients import cli, node_commands
from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.vocabulary import ENV_COORDINATOR
from tests.platform_process import ROOT

pytestmark = pytest.mark.timeout(60)


class SlowDeploy(coordinator_pb2_grpc.CoordinatorServicer):
    """A deploy that reports progress once and then takes as long as it likes."""

    def __init__(self) -> None:
        self.follower_left = asyncio.Event()

    async def Deploy(self, request, context):
        yield pb.DeployEvent(deploy_id="d-7", state=pb.DEPLOY_STATE_RUNNING, message="loading")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:  # the CLI cancelled its stream
            self.follower_left.set()
            raise


@contextlib.asynccontextmanager
async def serving(coordinator: coordinator_pb2_grpc.CoordinatorServicer) -> AsyncIterator[int]:
    """`coordinator` on a grpc.aio server on 127.0.0.1; its port."""
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(coordinator, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


# Ctrl-C as at a terminal: a test run started in the background of a non-interactive shell has
# SIGINT ignored, and a child inherits that (Python then installs no KeyboardInterrupt handler).
AS_AT_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "sys.argv[0] = 'mship'; runpy.run_module('clients.cli', run_name='__main__')")


async def mship_deploy(port: int, *args: str) -> asyncio.subprocess.Process:
    """`mship deploy ARGS` against the coordinator on `port`, as a process of its own."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", AS_AT_A_TERMINAL, "--coordinator", f"127.0.0.1:{port}", "deploy", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_while_following_a_deploy_stops_following_not_the_deploy(sig):
    coordinator = SlowDeploy()
    async with serving(coordinator) as port:
        cli = await mship_deploy(port, "--model", "builtin:tiny-qwen2", "--wait")
        assert cli.stdout is not None
        line = await asyncio.wait_for(cli.stdout.readline(), 30)
        assert line.decode().strip() == "deploy d-7: running (loading)"  # it is following
        cli.send_signal(sig)
        _, err = await asyncio.wait_for(cli.communicate(), 10)
        # SIGTERM is a supervisor's (an evicted Kubernetes Job): 3, so the Job retries and re-attaches
        assert cli.returncode == (3 if sig == signal.SIGTERM else 0), err.decode()
        assert "stopped following; the deploy continues (mship deploy --status d-7)" in err.decode()
        await asyncio.wait_for(coordinator.follower_left.wait(), 5)  # its stream was closed, nothing else


class Unanswering(coordinator_pb2_grpc.CoordinatorServicer):
    """Takes `deploy --status/--cancel` and a deploy, and answers none of them (a coordinator that
    hangs; a cancel waiting for its deploy to go back)."""

    def __init__(self) -> None:
        self.called = asyncio.Event()

    async def _hang(self) -> None:
        self.called.set()
        await asyncio.Event().wait()

    async def GetDeployment(self, request, context):
        await self._hang()

    async def CancelDeploy(self, request, context):
        await self._hang()

    async def Deploy(self, request, context):
        await self._hang()
        yield pb.DeployEvent()


NOT_FOLLOWED = {"status": ["--status", "d-7"], "cancel": ["--cancel", "d-7"],
                "deploy": ["--model", "builtin:tiny-qwen2"]}  # without --wait


@pytest.mark.parametrize("command", NOT_FOLLOWED)
async def test_ctrl_c_while_waiting_for_a_deploy_call_not_followed_is_one_line(command):
    coordinator = Unanswering()
    async with serving(coordinator) as port:
        cli = await mship_deploy(port, *NOT_FOLLOWED[command])
        await asyncio.wait_for(coordinator.called.wait(), 30)  # the CLI waits for the answer
        cli.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(cli.communicate(), 10)
        lines = err.decode().splitlines()
        assert cli.returncode == 0 and len(lines) == 1 and lines[0].startswith("mship: stopped waiting"), err.decode()
        if command == "cancel":
            assert "a cancel the coordinator received goes on (mship deploy --status d-7)" in lines[0]


class UnansweringBlocking(coordinator_pb2_grpc.CoordinatorServicer):
    """`Unanswering` on a blocking server: holds each call until the caller gives it up (10 s at most,
    then it answers)."""

    def _hang(self, context: grpc.ServicerContext) -> None:
        ended = threading.Event()
        context.add_callback(ended.set)
        ended.wait(10)

    def GetDeployment(self, request, context):
        self._hang(context)
        return pb.Deployment(deploy_id="d-7")

    CancelDeploy = GetDeployment

    def Deploy(self, request, context):
        self._hang(context)
        yield pb.DeployEvent(deploy_id="d-7", state=pb.DEPLOY_STATE_RUNNING)


@pytest.mark.parametrize("command", NOT_FOLLOWED)
def test_a_coordinator_that_does_not_answer_a_deploy_call_not_followed_is_given_up(command, monkeypatch, capsys):
    monkeypatch.setattr(cli, "ANSWER_TIMEOUT_S", 0.5)
    monkeypatch.setattr(cli, "CANCEL_TIMEOUT_S", 1.0)  # (150 s: the coordinator's cancel waits up to 120 s)
    server = grpc.server(ThreadPoolExecutor(4))
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(UnansweringBlocking(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        args = cli.parser().parse_args(["deploy", "--coordinator", f"127.0.0.1:{port}", *NOT_FOLLOWED[command]])
        code = cli.cmd_deploy(args)
    finally:
        server.stop(None)
    err = capsys.readouterr().err
    waited = "1s" if command == "cancel" else "0.5s"
    assert code == 3 and f"the coordinator at 127.0.0.1:{port} did not answer within {waited}" in err, err
    if command == "cancel":
        assert "a cancel the coordinator received goes on (mship deploy --status d-7)" in err


class RecordingStub:
    """Takes the DeployRequest and answers with one event (a deploy not followed); also the channel."""

    def __init__(self) -> None:
        self.requests: list[pb.DeployRequest] = []

    def Deploy(self, request, wait_for_ready=False, timeout=None):
        self.requests.append(request)
        return self

    def __iter__(self):
        return iter([pb.DeployEvent(deploy_id="d-1", state=pb.DEPLOY_STATE_RUNNING)])

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("flags", "sent"), [((), None), (("--drain-timeout", "0"), 0.0),
                                             (("--drain-timeout", "12.5"), 12.5)])
def test_the_drain_timeout_is_sent_only_when_given_and_zero_as_zero(flags, sent, capsys):
    args = cli.parser().parse_args(["deploy", "--model", "builtin:tiny-qwen2", *flags])
    stub = RecordingStub()
    assert cli.deploy(args, stub, cli._models_from_args(args)) == 0
    (request,) = stub.requests
    assert (request.drain_timeout_s if request.HasField("drain_timeout_s") else None) == sent  # 0: no drain


@pytest.mark.parametrize("argv", [["deploy", "--model", "builtin:tiny-qwen2", "--drain-timeout", "-5"],
                                  ["join", "--gcs-address", "127.0.0.1:1", "--no-metrics", "--drain-timeout", "-1"]])
def test_a_negative_drain_timeout_is_refused_before_anything_is_sent(argv, monkeypatch, capsys):
    stub = RecordingStub()
    monkeypatch.setattr(cli, "_stub", lambda args: (stub, stub))
    monkeypatch.setattr(node_commands, "_joined", lambda *a: pytest.fail("started a node"))
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2 and "--drain-timeout" in capsys.readouterr().err and not stub.requests


def test_the_coordinator_comes_from_the_flag_then_the_env_file_then_the_environment(tmp_path, monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(cli, "cmd_models", lambda args, verbose=False: seen.append(args.coordinator) or 0)
    monkeypatch.setenv(ENV_COORDINATOR, "10.0.0.1:50051")  # set, so monkeypatch restores it: the file changes it

    def dialled(*argv: str) -> str:
        with pytest.raises(SystemExit):
            cli.main(list(argv))
        return seen.pop()

    assert dialled("models") == "10.0.0.1:50051"
    env = tmp_path / "cluster.env"
    env.write_text(f"{ENV_COORDINATOR}=10.9.8.7:50051\n")
    env.chmod(0o600)
    assert dialled("models", "--env-file", str(env)) == "10.9.8.7:50051"
    assert dialled("models", "--env-file", str(env), "--coordinator", "h:1") == "h:1"
    assert dialled("--coordinator", "h:2", "models", "--env-file", str(env)) == "h:2"
    monkeypatch.delenv(ENV_COORDINATOR)
    assert dialled("models") == cli.DEFAULT_COORDINATOR


@pytest.mark.parametrize("argv", [["start", "--coordinator", "127.0.0.1:6000"],
                                  ["--coordinator", "127.0.0.1:6000", "start"],
                                  ["join", "--gcs-address", "127.0.0.1:1", "--coordinator", "127.0.0.1:6000"]])
def test_start_and_join_refuse_a_coordinator_they_would_ignore(argv, monkeypatch, capsys):
    monkeypatch.setattr(node_commands, "cmd_start", lambda *a: pytest.fail("started a platform"))
    monkeypatch.setattr(node_commands, "cmd_join", lambda *a: pytest.fail("started a node"))
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--coordinator:" in err
    command = "join" if "join" in argv else "start"
    assert ("--gcs-address" if command == "join" else "--coordinator-port") in err  # what to pass instead
    with pytest.raises(SystemExit):
        cli.parser().parse_args([command, "--help"])
    assert "--coordinator HOST:PORT" not in capsys.readouterr().out  # nor offered there
