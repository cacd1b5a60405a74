"""What the shared interceptors cost per streamed message: a grpc.aio server streaming Infer events
plain, with `server_interceptors()` (auth off), and with the platform token on (the server's token
check plus the client channel's bearer interceptor), same process, rounds interleaved (rotated).

Every worker token is one streamed message, so this is the interceptors' share of the token path;
the metrics interceptor of a later issue adds a row.

  .venv/bin/python bench/interceptor_overhead.py [--messages 20000] [--rounds 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from bench.report import pct, write_json
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.channels import aio_channel
from services.common.interceptors import server_interceptors
from services.common.vocabulary import ENV_RAY_AUTH_TOKEN


class Streamer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, messages: int) -> None:
        self.messages = messages

    async def Infer(self, request, context):
        event = pb.InferEvent(delta=pb.Delta(text="x", token_count=1))
        for _ in range(self.messages):
            yield event


TOKEN = "bench-token"


async def per_message_us(interceptors: list, messages: int, token: str | None = None) -> float:
    server = grpc.aio.server(interceptors=interceptors)
    worker_pb2_grpc.add_WorkerServicer_to_server(Streamer(messages), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio_channel(f"127.0.0.1:{port}", token=token) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            async for _ in stub.Infer(pb.InferRequest()):  # warm-up stream
                pass
            start, n = time.perf_counter(), 0
            async for _ in stub.Infer(pb.InferRequest()):
                n += 1
            return (time.perf_counter() - start) / n * 1e6
    finally:
        await server.stop(0)


def _with_token() -> list:
    os.environ[ENV_RAY_AUTH_TOKEN] = TOKEN  # server_interceptors() reads it when the server is built
    try:
        return server_interceptors()
    finally:
        del os.environ[ENV_RAY_AUTH_TOKEN]


async def main(args: argparse.Namespace) -> None:
    os.environ.pop(ENV_RAY_AUTH_TOKEN, None)
    runs: dict[str, list[float]] = {"plain": [], "interceptors": [], "interceptors+token": []}
    setups = {"plain": ([], None), "interceptors": (server_interceptors(), None),
              "interceptors+token": (_with_token(), TOKEN)}
    names = list(runs)
    for r in range(args.rounds):
        for name in names[r % 3:] + names[:r % 3]:
            interceptors, token = setups[name]
            runs[name].append(await per_message_us(interceptors, args.messages, token))
    p50 = {name: pct(values, 50) for name, values in runs.items()}
    print(f"{'server (client)':<44}{'us/message p50':>16}{'min':>10}{'max':>10}")
    labels = {"plain": "plain", "interceptors": "server_interceptors(), auth off",
              "interceptors+token": "server_interceptors() + token, bearer channel"}
    for name, values in runs.items():
        print(f"{labels[name]:<44}{p50[name]:>16.2f}{min(values):>10.2f}{max(values):>10.2f}")
    for name in names[1:]:
        print(f"added per message by {name} (p50): {p50[name] - p50['plain']:+.2f} us")
    if args.json:
        write_json(Path(args.json), args, runs_us=runs, p50_us=p50)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=6)  # a multiple of 3: each order equally often
    parser.add_argument("--json")
    asyncio.run(main(parser.parse_args()))
