"""Run `python -m services.worker` as a child process, for tests and benchmarks that need a real
worker outside their own process. Ends only the process it started, by its handle.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.worker.host import SERVICE_NAME

LISTENING = re.compile(r"worker listening on ([\d.]+):(\d+)")


@dataclass
class WorkerProcess:
    proc: subprocess.Popen
    log_path: Path
    host: str = ""
    port: int = 0
    health_seen: list[str] = field(default_factory=list)  # distinct statuses, in order

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def start(cls, model: str, log_path: Path, *, name: str | None = None, extra: list[str] | None = None,
              env: dict[str, str] | None = None, listen_timeout_s: float = 120.0) -> WorkerProcess:
        cmd = [sys.executable, "-m", "services.worker", "--model", model, "--port", "0",
               *(["--name", name] if name else []), *(extra or [])]
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=Path(__file__).resolve().parents[1])
        worker = cls(proc=proc, log_path=log_path)
        deadline = time.monotonic() + listen_timeout_s
        while time.monotonic() < deadline:
            match = LISTENING.search(log_path.read_text(errors="replace"))
            if match:
                worker.host, worker.port = match.group(1), int(match.group(2))
                return worker
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}:\n{worker.tail()}")
            time.sleep(0.05)
        worker.stop()
        raise TimeoutError(f"worker did not listen within {listen_timeout_s}s:\n{worker.tail()}")

    def wait_serving(self, timeout_s: float = 600.0) -> None:
        """Poll grpc.health.v1 until SERVING; records every distinct status seen on the way."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.tail()}")
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(
                    stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5).status)
                if not self.health_seen or self.health_seen[-1] != status:
                    self.health_seen.append(status)
                if status == "SERVING":
                    return
                time.sleep(0.1)
        raise TimeoutError(f"worker not SERVING within {timeout_s}s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the worker shuts its engine down), SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
