"""`mship start` as a child process for the platform tests: real CLI, real Ray, real Serve."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from mship.coordinator.v1 import coordinator_pb2_grpc
from mship.state.v1 import state_pb2, state_pb2_grpc
from services.common.channels import sync_channel
from services.common.vocabulary import ENV_CACHE_DIR, ENV_RAY_AUTH_TOKEN

ROOT = Path(__file__).resolve().parent.parent


# Below the kernel's ephemeral range (32768-60999) and above Ray's worker ports (10002-19999): a
# port picked here cannot be taken meanwhile by a process that binds port 0 or connects out (Ray's
# agents, vLLM's engine sockets), which a port picked by binding 0 ourselves could.
_PORTS = range(20000, 32768)


def free_port() -> int:
    """A loopback port nobody listens on now, outside the range the kernel hands out by itself."""
    for _ in range(200):
        port = random.choice(_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767")


def mship(*args: str, timeout_s: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the `mship` CLI (as `python -m clients.cli`, the console script's target)."""
    return subprocess.run([sys.executable, "-m", "clients.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})


@dataclass
class PlatformProcess:
    proc: subprocess.Popen
    log_path: Path
    http_port: int
    coordinator_port: int
    state_port: int
    gcs_port: int
    metrics_port: int = 0  # the head node's Prometheus port
    token: str | None = None  # the cluster token when started with --enable-ray-auth
    api_key: str | None = None  # a key the platform accepts (None: it runs without keys)

    @property
    def headers(self) -> dict[str, str]:
        """What a client of this platform sends: its API key, when it has keys."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def coordinator(self) -> str:
        return f"127.0.0.1:{self.coordinator_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @classmethod
    def start(cls, config: Path | None, log_path: Path, *, gateway_replicas: int | None = 2,
              state_store: str | None = None,
              env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> PlatformProcess:
        ports = [free_port() for _ in range(5)]  # every platform its own, GCS included: they run side by side
        cmd = [sys.executable, "-m", "clients.cli", "start", *(["--config", str(config)] if config else []),
               "--http-port", str(ports[0]), "--coordinator-port", str(ports[1]), "--state-port", str(ports[2]),
               "--gcs-port", str(ports[3]),
               *(["--gateway-replicas", str(gateway_replicas)] if gateway_replicas else []),
               "--metrics-port", str(ports[4]), *(["--state-store", state_store] if state_store else []), *extra]
        log = open(log_path, "w")
        # Its own process group (signals from a terminal's Ctrl-C stay out) but the caller's session:
        # with sched_autogroup a session is a CPU scheduling group, and the test client in a session
        # of its own waited 100-800 ms for a CPU next to the busy platform.
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, process_group=0)
        return cls(proc, log_path, *ports[:4], metrics_port=ports[4], token=(env or {}).get(ENV_RAY_AUTH_TOKEN))

    # ---- the coordinator's and the state service's view, over their real gRPC APIs ----
    def _coordinator(self, call: str, request, timeout_s: float = 30):
        with sync_channel(self.coordinator, token=self.token) as channel:
            return getattr(coordinator_pb2_grpc.CoordinatorStub(channel), call)(request, timeout=timeout_s)

    def sd_file(self) -> Path:
        """The head's Prometheus file_sd file (services/launcher.py PlatformConfig.service_discovery_file)."""
        root = Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "mship")
        return root / "run" / f"prometheus-sd-{self.coordinator_port}.json"

    def routing(self) -> cpb.RoutingSnapshot:
        with sync_channel(self.coordinator, token=self.token) as channel:
            stream = coordinator_pb2_grpc.CoordinatorStub(channel).WatchRouting(cpb.WatchRoutingRequest(), timeout=30)
            update = next(stream)
            stream.cancel()
        return update.snapshot

    def replicas(self, model: str) -> list[cpb.ReplicaInfo]:
        return [r for m in self.routing().models if m.name == model for r in m.replicas]

    def models(self) -> cpb.ListModelsResponse:
        return self._coordinator("ListModels", cpb.ListModelsRequest(include_serve_apps=True))

    def cluster_status(self) -> cpb.ClusterStatusResponse:
        return self._coordinator("ClusterStatus", cpb.ClusterStatusRequest())

    def leases(self) -> list[cpb.LeaseRecord]:
        return list(self._coordinator("ListLeases", cpb.ListLeasesRequest()).leases)

    def deployment(self, deploy_id: str) -> cpb.Deployment:
        return self._coordinator("GetDeployment", cpb.GetDeploymentRequest(deploy_id=deploy_id))

    def committed(self) -> list[common_pb2.ModelSpec]:
        with sync_channel(f"127.0.0.1:{self.state_port}", token=self.token) as channel:
            reply = state_pb2_grpc.StateStub(channel).GetModelSet(state_pb2.GetModelSetRequest(), timeout=10)
        return list(reply.models)

    def wait_ready(self, timeout_s: float = 900) -> None:
        """Poll /readyz until every expected model is routed and the start command is done."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mship start exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200 and \
                        "OpenAI API at" in self.log_path.read_text(errors="replace"):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"platform not ready within {timeout_s}s:\n{self.tail()}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def find(self, fragment: str) -> list[psutil.Process]:
        """Descendant processes whose command line contains `fragment` (e.g. a Serve replica's name)."""
        out = []
        for p in self.descendants():
            try:
                if fragment in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30) -> float:
        """SIGTERM, as an operator would; returns the seconds it took (SIGKILL after timeout_s)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                for p in [*self.descendants(), psutil.Process(self.proc.pid)]:
                    p.kill()
                self.proc.wait()
        return time.monotonic() - t0
