"""`mship join` as a child process: a second Ray node on this machine (loopback), for the cluster tests."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.platform_process import ROOT, free_port


@dataclass
class JoinProcess:
    proc: subprocess.Popen
    log_path: Path
    name: str
    metrics_port: int = 0

    @classmethod
    def start(cls, gcs_address: str, log_path: Path, *, name: str, env: dict[str, str],
              extra: tuple[str, ...] = ()) -> JoinProcess:
        metrics_port = free_port()  # every node its own (they share this machine)
        cmd = [sys.executable, "-m", "clients.cli", "join", "--gcs-address", gcs_address, "--node-name", name,
               "--metrics-port", str(metrics_port), *extra]
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
        return cls(proc, log_path, name, metrics_port)

    def wait_joined(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while "mship: joined" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mship join exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not joined within {timeout_s}s:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 60) -> float:
        """SIGTERM (a clean leave); the seconds it took. SIGKILL of its group after `timeout_s`."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:  # its Ray node runs in a process group of its own
                for p in [*psutil.Process(self.proc.pid).children(recursive=True), psutil.Process(self.proc.pid)]:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                self.proc.wait()
        return time.monotonic() - t0
