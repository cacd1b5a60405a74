"""llama.cpp's server inside the worker's own process (`llama_runtime: in_process`, PyPI xllamacpp).

xllamacpp runs llama.cpp's whole HTTP server (its routes, slots, continuous batching) on C++
threads of this process, listening on 127.0.0.1: the engine talks to it over HTTP exactly as it
talks to a `llama-server` subprocess (`llama_server.py`), one code path for both runtimes. What
differs: no process of its own (a llama.cpp crash takes the worker replica down with it, which
Serve then replaces), the xllamacpp build of llama.cpp instead of the packaged binary, and no
`llama_server_binary` / `llama_server_args` (there is no command line to pass them on).

Loading the model holds the GIL: the worker's event loop stalls for the load (about 0.5 s for
SmolLM2-135M; a large GGUF on a slow disk stalls it for its whole load).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.common.vocabulary import LLAMA_RUNTIMES
from services.worker.llama_server import START_TIMEOUT_S, LlamaServer, ServerConfig, wait_until_healthy

if TYPE_CHECKING:
    import httpx
    import xllamacpp

DEFAULT_RUNTIME = "server"           # what "" means (bench/llama_runtimes.py measured both)
LOG_WARNINGS = 2                     # llama.cpp's log verbosity: errors and warnings, no per-request lines
POOLING = ("none", "mean", "cls", "last", "rank")  # llama-server's --pooling values, in enum order


def runtime_class(runtime: str) -> type[LlamaServer] | type[InProcessServer]:
    """The server class of a `LlamaCppOptions.runtime` ("" = the default)."""
    name = runtime or DEFAULT_RUNTIME
    if name not in LLAMA_RUNTIMES:
        raise ValueError(f"unknown llama_runtime {runtime!r}; one of {', '.join(LLAMA_RUNTIMES)}")
    return InProcessServer if name == "in_process" else LlamaServer


def common_params(cfg: ServerConfig) -> xllamacpp.CommonParams:
    """The xllamacpp parameters equal to `cfg.argv(...)` for `llama-server`."""
    import xllamacpp

    if cfg.binary or cfg.extra_args:
        raise ValueError("llama_server_binary and llama_server_args apply to llama_runtime 'server' only "
                         "(in_process runs the xllamacpp build, with no command line)")
    p = xllamacpp.CommonParams()
    p.model.path = cfg.model_path
    p.hostnames, p.port = ["127.0.0.1"], 0    # an ephemeral loopback port: listening_address
    p.n_parallel, p.n_ctx = cfg.n_parallel, cfg.n_ctx * cfg.n_parallel
    p.n_gpu_layers = cfg.n_gpu_layers
    p.endpoint_metrics, p.endpoint_slots, p.ui, p.use_jinja = True, True, False, True
    # No prompt cache shared across slots (--cache-ram 0 --no-cache-idle-slots): see SlotPool.
    p.cache_ram_mib, p.cache_idle_slots = 0, False
    if cfg.n_threads:
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = cfg.n_threads  # -t
    if cfg.chat_template:
        p.chat_template = cfg.chat_template  # what --chat-template-file reads into
    if cfg.embeddings:
        p.embedding = True
        if cfg.pooling:
            if cfg.pooling not in POOLING:
                raise ValueError(f"unknown pooling {cfg.pooling!r}; one of {', '.join(POOLING)}")
            p.pooling_type = xllamacpp.llama_pooling_type(POOLING.index(cfg.pooling))
    p.verbosity = LOG_WARNINGS  # its log lines go to the worker's stderr, not into tail()
    return p


class InProcessServer:
    """The `LlamaServer` interface the engine uses (url, alive, tail, wait_healthy, stop) over an
    in-process `xllamacpp.Server`."""

    def __init__(self, server: Any, url: str) -> None:
        self._server: Any = server
        self._url = url

    @classmethod
    def spawn(cls, cfg: ServerConfig) -> InProcessServer:
        """Loads the model and starts listening; returns once it is loaded (RuntimeError if not)."""
        import xllamacpp

        params = common_params(cfg)
        try:
            server = xllamacpp.Server(params)
        except RuntimeError as e:  # llama.cpp logged the reason (to stderr) before this
            raise RuntimeError(f"xllamacpp could not start {cfg.model_path}: {e}") from e
        address = server.listening_address
        return cls(server, address if "://" in address else f"http://{address}")

    @property
    def url(self) -> str:
        return self._url

    @property
    def alive(self) -> bool:
        """Until stop(): a crash of llama.cpp in this process ends the process itself."""
        return self._server is not None

    def tail(self, lines: int = 15) -> str:
        return "(in-process llama.cpp: its log is this worker's stderr)"

    async def wait_healthy(self, client: httpx.AsyncClient, timeout_s: float = START_TIMEOUT_S) -> None:
        """spawn() returned with the model loaded: /health answers at once (RuntimeError if not)."""
        await wait_until_healthy(client, lambda: self.alive, min(timeout_s, 30.0), lambda: (
            f"in-process llama.cpp at {self._url} " + ("was stopped" if not self.alive else "not healthy")))

    def kill(self) -> None:
        """Nothing to kill apart from this process: a hung in-process llama.cpp goes with its replica."""

    def stop(self, grace_s: float = 10.0) -> None:
        """Stops its loop and HTTP threads and frees the model (the C++ destructor joins them)."""
        server, self._server = self._server, None
        del server
