"""The portable llama.cpp server (`llama_portable.py`, the xllamacpp build in a child process) that
the `server` runtime starts where the packaged llama-server's build does not fit the CPU; forced
here so it runs on every CI machine, whichever CPU it has. Real model: builtin:smollm2-135m-instruct
(a Q4_1 GGUF: quantized matmuls, the path the packaged build dies on without AVX-VNNI)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import psutil
import pytest

from services.worker import llama_server
from services.worker.gguf_models import resolve_gguf
from services.worker.llama_server import LlamaServer, ServerConfig

pytestmark = pytest.mark.integration


@pytest.fixture
async def portable(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[LlamaServer, httpx.AsyncClient]]:
    monkeypatch.setattr(llama_server, "packaged_unfit_reason", lambda: "forced by the test")
    path, _ = resolve_gguf("builtin:smollm2-135m-instruct")
    server = LlamaServer.spawn(ServerConfig(model_path=str(path), n_ctx=512, n_parallel=2, n_threads=1))
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await server.wait_healthy(client, timeout_s=120)
            yield server, client
    finally:
        server.stop()


async def test_it_serves_llama_cpps_own_api_in_a_process_of_its_own(portable):
    server, client = portable
    assert "services.worker.llama_portable" in psutil.Process(server.proc.pid).cmdline()
    body = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 32, "temperature": 0,
            "stream": True}
    text = ""
    async with client.stream("POST", "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    assert "4" in text, text
    slots = (await client.get("/slots")).json()
    assert len(slots) == 2  # -np 2: the slots the engine schedules on


async def test_stop_ends_it_cleanly(portable):
    server, _ = portable
    server.stop()
    assert server.proc.returncode == 0  # it left on SIGTERM by itself, not killed after the grace


def test_it_ends_with_its_parent(tmp_path):
    """A worker that dies (SIGKILL, no cleanup) takes its portable server with it."""
    path, _ = resolve_gguf("builtin:smollm2-135m-instruct")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_path": str(path), "n_ctx": 256, "n_parallel": 1, "n_threads": 1}))
    worker = ("import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-m', "
              f"'services.worker.llama_portable', {str(config)!r}, '0', str(os.getpid())]); "
              "print(p.pid, flush=True); p.wait()")
    parent = subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        child.wait(30)  # psutil.TimeoutExpired if it outlived its parent
    finally:
        parent.kill()
