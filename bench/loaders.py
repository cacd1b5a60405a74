"""The llama_cpp loader against the bare llama-server it wraps: the same GGUF, the same slots.

Bare: llama-server's own streaming `/completion` over HTTP (prompt rendered by its template).
mship: the worker's gRPC `Infer` (`python -m services.worker`, a process of its own as a replica
is) over its own llama-server. Rounds interleave (bare, mship / mship, bare) so drift on a busy machine hits both;
tokens/s at 1 and 4 concurrent streams, and time to first token, p50 over rounds.

  .venv/bin/python bench/loaders.py [--tokens 64] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import httpx

from bench.report import pct, write_json
from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.worker.gguf_models import resolve_gguf
from services.worker.llama_server import LlamaServer
from tests.worker_process import WorkerProcess

QUESTION = "Tell me a long story about a lighthouse keeper."
SLOTS = 4


async def bare_stream(client: httpx.AsyncClient, prompt: str, tokens: int) -> tuple[float, int]:
    t0, first, n = time.perf_counter(), None, 0
    body = {"prompt": prompt, "stream": True, "n_predict": tokens, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False}
    async with client.stream("POST", "/completion", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                first = first or time.perf_counter()
                n += 1
    return (first or time.perf_counter()) - t0, n


async def mship_stream(stub: worker_pb2_grpc.WorkerStub, tokens: int, i: int) -> tuple[float, int]:
    t0, first, n = time.perf_counter(), None, 0
    request = pb.InferRequest(model="bench", cache_salt=f"bench-{i}-{time.monotonic_ns()}",  # no cache reuse
                              chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content=QUESTION)]),
                              sampling=pb.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    async for event in stub.Infer(request):
        if event.HasField("delta") and event.delta.text:
            first = first or time.perf_counter()
            n += event.delta.token_count
    return (first or time.perf_counter()) - t0, n


async def run(streams: int, one) -> tuple[float, float]:
    """(tokens/s over all streams, mean TTFT in ms)."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*[one(i) for i in range(streams)])
    wall = time.perf_counter() - t0
    return sum(n for _, n in results) / wall, 1000 * sum(t for t, _ in results) / streams


async def main(args: argparse.Namespace) -> None:
    spec = common_pb2.ModelSpec(name="bench", model=args.model, loader=common_pb2.LOADER_LLAMA_CPP,
                                max_model_len=2048, max_num_seqs=SLOTS, num_cpus=args.threads)
    # The worker in a process of its own, as a replica runs: in this one its event loop and GIL would
    # be shared with the benchmark's client and count against mship.
    worker = WorkerProcess.start(args.model, Path(tempfile.mkdtemp(prefix="mship-bench-")) / "worker.log",
                                 name="bench", extra=["--loader", "llama_cpp", "--max-model-len", "2048",
                                                      "--max-num-seqs", str(SLOTS), "--num-cpus", str(args.threads)])
    await asyncio.to_thread(worker.wait_serving)
    from services.worker.llama_cpp_engine import server_config

    path, template = resolve_gguf(args.model)
    bare = LlamaServer.spawn(server_config(spec, str(path), template))
    results: dict[str, dict[int, list[tuple[float, float]]]] = {"bare": {1: [], 4: []}, "mship": {1: [], 4: []}}
    try:
        async with httpx.AsyncClient(base_url=bare.url, timeout=None) as client, \
                grpc.aio.insecure_channel(worker.address) as channel:
            await bare.wait_healthy(client)
            prompt = (await client.post("/apply-template", json={
                "messages": [{"role": "user", "content": QUESTION}]})).json()["prompt"]
            stub = worker_pb2_grpc.WorkerStub(channel)
            sides = {"bare": lambda i: bare_stream(client, prompt, args.tokens),
                     "mship": lambda i: mship_stream(stub, args.tokens, i)}
            for one in sides.values():  # warm both
                await run(1, one)
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for streams in (1, SLOTS):
                    for side in order:
                        results[side][streams].append(await run(streams, sides[side]))
    finally:
        bare.stop()
        worker.stop()
    print(f"{args.model}, {args.tokens} tokens per stream, {args.threads} thread(s), {args.rounds} rounds (p50)")
    print(f"{'':<8}{'tok/s x1':>10}{'tok/s x4':>10}{'TTFT x1 ms':>12}{'TTFT x4 ms':>12}")
    p50: dict[str, dict[str, float]] = {}
    for side, by in results.items():
        p50[side] = {f"tps_{s}": pct([t for t, _ in by[s]], 50) for s in by} | {
            f"ttft_ms_{s}": pct([f for _, f in by[s]], 50) for s in by}
        row = p50[side]
        print(f"{side:<8}{row['tps_1']:>10.1f}{row['tps_4']:>10.1f}{row['ttft_ms_1']:>12.1f}{row['ttft_ms_4']:>12.1f}")
    for s in (1, SLOTS):
        print(f"mship / bare throughput x{s}: {100 * p50['mship'][f'tps_{s}'] / p50['bare'][f'tps_{s}']:.1f}%  "
              f"TTFT {p50['mship'][f'ttft_ms_{s}'] - p50['bare'][f'ttft_ms_{s}']:+.1f} ms")
    if args.json:
        write_json(Path(args.json), args, p50=p50, rounds={k: {str(s): v for s, v in by.items()}
                                                            for k, by in results.items()})


def llama_bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of the llama.cpp benches (this one, bench/llama_runtimes.py)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    return parser


if __name__ == "__main__":
    asyncio.run(main(llama_bench_parser(__doc__).parse_args()))
