"""The `mship` CLI process against a stand-in coordinator (a real grpc.aio server in the test):
an operator who interrupts `mship deploy --wait` stops following; the deploy is left running."""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc
import pytest

from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_while_following_a_deploy_stops_following_not_the_deploy(sig):
    coordinator = SlowDeploy()
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(coordinator, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clients.cli", "--coordinator", f"127.0.0.1:{port}", "deploy",
            "--model", "builtin:tiny-qwen2", "--wait", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert cli.stdout is not None
        line = await asyncio.wait_for(cli.stdout.readline(), 30)
        assert line.decode().strip() == "deploy d-7: running (loading)"  # it is following
        cli.send_signal(sig)
        _, err = await asyncio.wait_for(cli.communicate(), 10)
        # SIGTERM is a supervisor's (an evicted Kubernetes Job): 3, so the Job retries and re-attaches
        assert cli.returncode == (3 if sig == signal.SIGTERM else 0), err.decode()
        assert "stopped following; the deploy continues (mship deploy --status d-7)" in err.decode()
        await asyncio.wait_for(coordinator.follower_left.wait(), 5)  # its stream was closed, nothing else
    finally:
        await server.stop(0)
