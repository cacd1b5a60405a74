"""A vLLM model and a llama.cpp model sharing one node: each one's throughput alone, then both under
load at once, as a share of its solo throughput (target: each keeps >= 30%).

Both are real worker processes (`python -m services.worker`), each given its CPU share the way a
replica is (vLLM: one OMP thread; llama.cpp: `num_cpus` threads), driven over gRPC by `--streams`
concurrent greedy streams of `--tokens` tokens each, for `--seconds`.

  .venv/bin/python bench/shared_node.py [--seconds 20] [--streams 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from bench.report import write_json
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from tests.worker_process import WorkerProcess

MODELS = {"vllm": ("builtin:tiny-qwen2", ["--loader", "vllm", "--max-num-seqs", "4"]),
          "llama_cpp": ("builtin:smollm2-135m-instruct", ["--loader", "llama_cpp", "--max-num-seqs", "4",
                                                          "--num-cpus", "1"])}


async def drive(address: str, name: str, streams: int, tokens: int, seconds: float) -> float:
    """Generated tokens per second over `seconds` of `streams` back-to-back streams."""
    deadline = time.monotonic() + seconds
    total = 0

    async def one(stub: worker_pb2_grpc.WorkerStub) -> None:
        nonlocal total
        while time.monotonic() < deadline:
            request = pb.InferRequest(model=name, chat=pb.ChatInput(messages=[
                pb.ChatMessage(role="user", content="Tell me a story.")]),
                sampling=pb.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
            async for event in stub.Infer(request):
                if event.HasField("delta"):
                    total += event.delta.token_count

    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        t0 = time.monotonic()
        await asyncio.gather(*[one(stub) for _ in range(streams)])
        return total / (time.monotonic() - t0)


async def main(args: argparse.Namespace) -> None:
    logs = Path(tempfile.mkdtemp(prefix="mship-shared-node-"))
    workers = {loader: WorkerProcess.start(model, logs / f"{loader}.log", name=loader, extra=extra)
               for loader, (model, extra) in MODELS.items()}
    try:
        for w in workers.values():
            w.wait_serving()
        solo = {}
        for loader, w in workers.items():
            solo[loader] = await drive(w.address, loader, args.streams, args.tokens, args.seconds)
        both = await asyncio.gather(*[drive(w.address, loader, args.streams, args.tokens, args.seconds)
                                      for loader, w in workers.items()])
        shared = dict(zip(workers, both, strict=True))
    finally:
        for w in workers.values():
            w.stop()
    print(f"{args.streams} streams each, {args.tokens} tokens per request, {args.seconds:.0f} s per phase")
    print(f"{'loader':<12}{'solo tok/s':>12}{'shared tok/s':>14}{'share of solo':>15}")
    for loader in workers:
        print(f"{loader:<12}{solo[loader]:>12.1f}{shared[loader]:>14.1f}{100 * shared[loader] / solo[loader]:>14.0f}%")
    if args.json:
        write_json(Path(args.json), args, solo_tps=solo, shared_tps=shared)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json")
    asyncio.run(main(parser.parse_args()))
