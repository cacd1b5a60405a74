"""What the shared server interceptors cost per streamed message: one grpc.aio server streaming
Infer events with `server_interceptors()` vs one without, same process, rounds interleaved (A/B, B/A).

Every worker token is one streamed message, so this is the interceptors' share of the token path;
the auth and metrics interceptors of later issues add to the same row.

  .venv/bin/python bench/interceptor_overhead.py [--messages 20000] [--rounds 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from bench.report import pct, write_json
from mship.worker.v1 import worker_pb2 as pb
from mship.worker.v1 import worker_pb2_grpc
from services.common.interceptors import server_interceptors


class Streamer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, messages: int) -> None:
        self.messages = messages

    async def Infer(self, request, context):
        event = pb.InferEvent(delta=pb.Delta(text="x", token_count=1))
        for _ in range(self.messages):
            yield event


async def per_message_us(interceptors: list, messages: int) -> float:
    server = grpc.aio.server(interceptors=interceptors)
    worker_pb2_grpc.add_WorkerServicer_to_server(Streamer(messages), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            async for _ in stub.Infer(pb.InferRequest()):  # warm-up stream
                pass
            start, n = time.perf_counter(), 0
            async for _ in stub.Infer(pb.InferRequest()):
                n += 1
            return (time.perf_counter() - start) / n * 1e6
    finally:
        await server.stop(0)


async def main(args: argparse.Namespace) -> None:
    plain: list[float] = []
    intercepted: list[float] = []
    for r in range(args.rounds):
        order = [(plain, []), (intercepted, server_interceptors())]
        for into, interceptors in order if r % 2 == 0 else reversed(order):
            into.append(await per_message_us(interceptors, args.messages))
    p50 = {"plain": pct(plain, 50), "interceptors": pct(intercepted, 50)}
    print(f"{'server':<24}{'us/message p50':>16}{'min':>10}{'max':>10}")
    for name, values in (("plain", plain), ("server_interceptors()", intercepted)):
        print(f"{name:<24}{pct(values, 50):>16.2f}{min(values):>10.2f}{max(values):>10.2f}")
    print(f"added per message (p50): {p50['interceptors'] - p50['plain']:+.2f} us")
    if args.json:
        write_json(Path(args.json), args, plain_us=plain, interceptors_us=intercepted, p50_us=p50)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json")
    asyncio.run(main(parser.parse_args()))
