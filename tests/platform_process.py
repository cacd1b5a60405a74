"""`mship start` as a child process for the platform tests: real CLI, real Ray, real Serve."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def coordinator(self) -> str:
        return f"127.0.0.1:{self.coordinator_port}"

    @classmethod
    def start(cls, config: Path | None, log_path: Path, *, gateway_replicas: int = 2, state_store: str | None = None,
              env: dict[str, str] | None = None) -> PlatformProcess:
        ports = [free_port() for _ in range(3)]
        cmd = [sys.executable, "-m", "clients.cli", "start", *(["--config", str(config)] if config else []),
               "--http-port", str(ports[0]), "--coordinator-port", str(ports[1]), "--state-port", str(ports[2]),
               "--gateway-replicas", str(gateway_replicas), *(["--state-store", state_store] if state_store else [])]
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        return cls(proc, log_path, *ports)

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
