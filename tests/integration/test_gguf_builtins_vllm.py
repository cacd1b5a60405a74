"""The GGUF builtins dequantised for vLLM: builtin:gemma-3-270m (the real Gemma 3 270M from its
PyPI GGUF; a base model, it continues text coherently) and builtin:smollm2-135m-instruct (an
instruct model: it answers a chat). On llama_cpp the same GGUFs run as they are
(test_worker_llama.py, test_loaders.py)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from tests.worker_calls import chat, collect, greedy
from tests.worker_process import WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory):
    from services.worker.builtin import resolve_model_ref

    path = Path(resolve_model_ref("builtin:gemma-3-270m"))
    assert (path / "model.safetensors").stat().st_size > 400 * 2**20  # bf16 weights, not the GGUF
    worker = WorkerProcess.start("builtin:gemma-3-270m", Path(tmp_path_factory.mktemp("gemma")) / "worker.log",
                                 name="gemma", extra=["--max-model-len", "512"])
    try:
        worker.wait_serving()
        yield worker
    finally:
        worker.stop()


async def test_gemma_continues_text_coherently(gemma):
    async with grpc.aio.insecure_channel(gemma.address) as channel:
        r = await collect(worker_pb2_grpc.WorkerStub(channel), pb.InferRequest(
            model="gemma", prompt=pb.PromptInput(text="The capital of France is"),
            sampling=pb.SamplingParams(max_tokens=16, temperature=0.0)))
    words = r.text.split()
    assert len(words) >= 5 and ("France" in r.text or "Paris" in r.text), r.text
    assert all(w.isascii() for w in words)


async def test_smollm2_on_vllm_answers_a_chat(tmp_path):
    worker = WorkerProcess.start("builtin:smollm2-135m-instruct", tmp_path / "worker.log", name="smol",
                                 extra=["--max-model-len", "512"])
    try:
        worker.wait_serving()
        async with grpc.aio.insecure_channel(worker.address) as channel:
            r = await collect(worker_pb2_grpc.WorkerStub(channel), chat("What is 2+2?", model="smol",
                                                                         sampling=greedy(24)))
    finally:
        worker.stop()
    assert "4" in r.text and r.final.choices[0].finish_reason == pb.FINISH_REASON_STOP, r.text
