"""The in-process llama.cpp runtime's parameters (no model loaded): the same server llama-server's
command line would give, and the runtime chosen by `LlamaCppOptions.runtime`."""

from __future__ import annotations

import pytest

from services.worker.llama_inprocess import InProcessServer, common_params, runtime_class
from services.worker.llama_server import LlamaServer, ServerConfig

xllamacpp = pytest.importorskip("xllamacpp")


def test_the_runtime_follows_llama_runtime():
    assert runtime_class("server") is LlamaServer and runtime_class("in_process") is InProcessServer
    assert runtime_class("") is LlamaServer  # the default: measured in bench/llama_runtimes.py
    with pytest.raises(ValueError, match="unknown llama_runtime"):
        runtime_class("subprocess")


def test_params_are_the_llama_server_flags():
    cfg = ServerConfig(model_path="/models/m.gguf", n_ctx=2048, n_parallel=4, n_threads=3, n_gpu_layers=7,
                       chat_template="{{ messages }}")
    p = common_params(cfg)
    argv = cfg.argv("llama-server", 8080, "t.jinja")
    assert p.model.path == "/models/m.gguf"
    assert p.n_parallel == 4 and p.n_ctx == 4 * 2048 == int(argv[argv.index("-c") + 1])  # per slot x slots
    assert p.cpuparams.n_threads == p.cpuparams_batch.n_threads == 3
    assert p.n_gpu_layers == 7
    assert p.chat_template == "{{ messages }}" and p.use_jinja
    assert p.hostnames == ["127.0.0.1"] and p.port == 0  # loopback only, an ephemeral port
    # --cache-ram 0 --no-cache-idle-slots: no prompt cache shared across slots
    assert "--no-cache-idle-slots" in argv and p.cache_ram_mib == 0 and not p.cache_idle_slots
    assert p.endpoint_metrics and p.endpoint_slots and not p.ui
    assert not p.embedding


def test_defaults_are_the_model_and_the_machine():
    p = common_params(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=1))
    assert p.cpuparams.n_threads == -1 and p.chat_template == ""  # llama.cpp's own choice, the GGUF's template
    assert p.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_UNSPECIFIED


def test_embeddings_and_pooling():
    p = common_params(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=2, embeddings=True, pooling="mean"))
    assert p.embedding and p.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    own = common_params(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=2, embeddings=True))
    assert own.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_UNSPECIFIED
    with pytest.raises(ValueError, match="unknown pooling"):
        common_params(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=2, embeddings=True, pooling="max"))


@pytest.mark.parametrize("given", [{"binary": "/opt/llama-server"}, {"extra_args": ["--flash-attn", "on"]}])
def test_subprocess_only_options_are_refused(given):
    with pytest.raises(ValueError, match="llama_runtime 'server' only"):
        common_params(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=1, **given))


def test_a_stopped_server_is_not_alive():
    server = InProcessServer(object(), "http://127.0.0.1:1")
    assert server.alive and server.url == "http://127.0.0.1:1"
    server.stop()
    assert not server.alive
    server.stop()  # twice: nothing left to stop
