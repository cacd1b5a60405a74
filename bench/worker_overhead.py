"""What the worker's gRPC hop costs: builtin:tiny-qwen2 through `python -m services.worker` (gRPC)
vs the same engine configuration called in-process (`AsyncLLM`), in one run, interleaved.

Prints a table; --json PATH writes the numbers. Targets (issue 2): the gRPC hop adds <= 0.5 ms p50
to time-to-first-token and <= 2% to tokens/s.

  .venv/bin/python bench/worker_overhead.py [--ttft-samples 100] [--tokens 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

import grpc  # noqa: E402

from bench.report import pct, write_json  # noqa: E402
from mship.worker.v1 import worker_pb2 as pb  # noqa: E402
from mship.worker.v1 import worker_pb2_grpc  # noqa: E402
from services.worker.builtin import resolve_model_ref  # noqa: E402
from services.worker.vllm_engine import engine_args_for, set_engine_env  # noqa: E402
from tests.worker_process import WorkerProcess  # noqa: E402

PROMPT = "Tell me a story."
MAX_NUM_SEQS = 16


class InProcess:
    """The baseline: AsyncLLM in this process, same render path (chat template + tokenizer)."""

    def __init__(self, model_path: str) -> None:
        set_engine_env()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args_for(
            model_path, "tiny", max_model_len=1024, max_num_seqs=MAX_NUM_SEQS)))

    async def stream(self, max_tokens: int) -> tuple[float, int, float]:
        from vllm import SamplingParams
        from vllm.renderers.params import ChatParams, TokenizeParams
        from vllm.sampling_params import RequestOutputKind

        t0 = time.perf_counter()
        _, (prompt,) = await self.engine.renderer.render_chat_async(
            [[{"role": "user", "content": PROMPT}]], ChatParams(chat_template_kwargs={"add_generation_prompt": True}),
            TokenizeParams(max_total_tokens=None, add_special_tokens=False))
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA)
        ttft, tokens = 0.0, 0
        async for out in self.engine.generate(prompt, params, uuid.uuid4().hex):
            if not tokens:
                ttft = time.perf_counter() - t0
            tokens += len(out.outputs[0].token_ids)
        return ttft, tokens, time.perf_counter() - t0


class OverGrpc:
    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)

    async def stream(self, max_tokens: int) -> tuple[float, int, float]:
        request = pb.InferRequest(
            model="tiny", chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content=PROMPT)]),
            sampling=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0))
        t0 = time.perf_counter()
        ttft, tokens = 0.0, 0
        async for event in self.stub.Infer(request):
            if event.HasField("delta"):
                if not tokens:
                    ttft = time.perf_counter() - t0
                tokens += event.delta.token_count
        return ttft, tokens, time.perf_counter() - t0


async def throughput(path, streams: int, max_tokens: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*[path.stream(max_tokens) for _ in range(streams)])
    wall = time.perf_counter() - t0
    return sum(r[1] for r in results) / wall, [r[0] for r in results]


async def run(args: argparse.Namespace, inproc: InProcess, address: str) -> dict:
    # the gRPC channel must be made on this loop
    paths: dict[str, object] = {"in-process AsyncLLM": inproc, "gRPC worker": OverGrpc(address)}
    for path in paths.values():  # warm both
        for _ in range(5):
            await path.stream(16)
    ttft: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.ttft_samples):  # alternate request by request: drift hits both equally
        for name, path in paths.items():
            ttft[name].append((await path.stream(8))[0] * 1000)
    table: dict[str, dict] = {name: {"ttft_p50_ms": statistics.median(v), "ttft_p99_ms": pct(v, 99)}
                              for name, v in ttft.items()}
    for streams, reps in ((1, args.reps), (8, args.reps)):
        rates: dict[str, list[float]] = {name: [] for name in paths}
        first: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(reps):
            for name, path in paths.items():
                rate, ttfts = await throughput(path, streams, args.tokens)
                rates[name].append(rate)
                first[name].extend(t * 1000 for t in ttfts)
        for name in paths:
            table[name][f"tok_s_{streams}"] = statistics.median(rates[name])
            table[name][f"ttft_p50_ms_{streams}"] = statistics.median(first[name])
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ttft-samples", type=int, default=100)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    model = resolve_model_ref("builtin:tiny-qwen2")
    log = Path(tempfile.mkdtemp(prefix="mship-bench-")) / "worker.log"
    worker = WorkerProcess.start("builtin:tiny-qwen2", log, name="tiny",
                                 extra=["--max-model-len", "1024", "--max-num-seqs", str(MAX_NUM_SEQS)])
    inproc = None
    try:
        worker.wait_serving()
        inproc = InProcess(model)
        table = asyncio.run(run(args, inproc, worker.address))
    finally:
        worker.stop()
        if inproc is not None:
            inproc.engine.shutdown()
    base, hop = table["in-process AsyncLLM"], table["gRPC worker"]
    summary = {
        "ttft_p50_added_ms": hop["ttft_p50_ms"] - base["ttft_p50_ms"],
        "tok_s_1_change_pct": 100 * (hop["tok_s_1"] / base["tok_s_1"] - 1),
        "tok_s_8_change_pct": 100 * (hop["tok_s_8"] / base["tok_s_8"] - 1),
    }
    cols = ["ttft_p50_ms", "ttft_p99_ms", "tok_s_1", "ttft_p50_ms_1", "tok_s_8", "ttft_p50_ms_8"]
    print(f"{'path':<22}" + "".join(f"{c:>15}" for c in cols))
    for name, row in table.items():
        print(f"{name:<22}" + "".join(f"{row[c]:>15.2f}" for c in cols))
    print("gRPC hop: TTFT p50 {ttft_p50_added_ms:+.2f} ms (target <= +0.5), tok/s 1 stream "
          "{tok_s_1_change_pct:+.1f}%, 8 streams {tok_s_8_change_pct:+.1f}% (target >= -2%)".format(**summary))
    if args.json:
        write_json(args.json, args, table=table, summary=summary)


if __name__ == "__main__":
    main()
