"""Would a multiplexed worker stream bring a separate edge to vLLM's own throughput on this box?

The question #18 leaves to a design decision, asked of the real engine. One worker process serves
tiny-qwen2 through the platform's own `WorkerServicer` (vLLM's AsyncLLM, the same rendering, parsing
and events as a worker replica) on two transports at once:
  floor  bench/edge_floor.py: one Infer stream per request (the platform's contract)
  mux    the same servicer's Infer streams, multiplexed: one gRPC stream per edge carries every
         request's deltas, whatever is ready sent as one message (bench/mux_floor.py's wire format
         and edge; the final frame's text is the completion token count)
beside vLLM's own OpenAI server, interleaved in one run (bench/edge_overhead.py's client, meters
and quiet waits). Both edges are bench toys that only carry tokens, at the replicas' niceness and
with a gateway replica's environment: the floor of what any separate edge keeps of vLLM's
throughput under each contract, not servers to use.

  .venv/bin/python bench/mux_vllm.py [--model builtin:tiny-qwen2] [--rounds 3] [--tokens 64] [--aa]
                                     [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import httpx  # noqa: E402
import psutil  # noqa: E402
import uvloop  # noqa: E402

from bench import edge_overhead as eo  # noqa: E402
from bench.edge_floor import chunk, sse  # noqa: E402
from bench.mux_floor import FRAME, OPEN, MuxReader, serve_edge  # noqa: E402
from bench.report import stop_processes, unwind_on_signals, write_json  # noqa: E402
from mship.worker.v1 import worker_pb2 as pb  # noqa: E402

if TYPE_CHECKING:
    from services.worker.servicer import WorkerServicer

# ---- the worker: the platform's servicer, also behind one multiplexed stream ---------------------
def infer_request(rid: str, max_tokens: int) -> pb.InferRequest:
    return pb.InferRequest(request_id=rid, model=eo.MODEL, sampling=pb.SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=0.0), chat=pb.ChatInput(messages=[
            pb.ChatMessage(role=m["role"], content=m["content"]) for m in eo.MESSAGES]))


def mux_handler(servicer: WorkerServicer) -> grpc.GenericRpcHandler:
    """Each opened request runs the servicer's own Infer; the stream sends all frames that are ready
    as one message (an engine step wakes every request at once, so: one message per step)."""
    ids = itertools.count()

    async def stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        pending: list[bytes] = []
        ready = asyncio.Event()
        tasks: set[asyncio.Task] = set()

        async def one(sid: int, max_tokens: int) -> None:
            async for event in servicer.Infer(infer_request(f"mux-{next(ids)}", max_tokens), context):
                if event.HasField("delta"):
                    text = event.delta.text.encode()
                    pending.append(FRAME.pack(sid, 0, len(text)) + text)
                elif event.HasField("final"):
                    count = b"%d" % event.final.usage.completion_tokens
                    pending.append(FRAME.pack(sid, 1, len(count)) + count)
                ready.set()

        async def read() -> None:
            async for message in requests:
                task = asyncio.ensure_future(one(*OPEN.unpack(message)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                await ready.wait()
                ready.clear()
                batch = b"".join(pending)
                pending.clear()
                yield batch
        finally:
            reader.cancel()
            for task in tasks:
                task.cancel()

    return grpc.method_handlers_generic_handler("bench.Mux", {"Stream": grpc.stream_stream_rpc_method_handler(stream)})


async def serve_worker(model: str) -> None:
    from mship.common.v1 import common_pb2
    from services.worker.server import start_worker_server

    spec = common_pb2.ModelSpec(name=eo.MODEL, model=model, loader=common_pb2.LOADER_VLLM,
                                usecase=common_pb2.USECASE_GENERATE, max_model_len=eo.MAX_MODEL_LEN,
                                max_num_seqs=eo.MAX_NUM_SEQS)
    worker = await start_worker_server(spec, "127.0.0.1", 0)
    await worker.host.wait_ready()
    mux = grpc.aio.server()
    mux.add_generic_rpc_handlers([mux_handler(worker.servicer)])
    mux_port = mux.add_insecure_port("127.0.0.1:0")
    await mux.start()
    print(f"ports {worker.port} {mux_port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)  # the engine's processes go with us
    await stop.wait()
    await mux.stop(1)
    await worker.stop(grace_s=1)


# ---- the multiplexed edge: bench/mux_floor.py's, with the usage chunk the bench counts tokens by --
class CountingMuxReader(MuxReader):
    @staticmethod
    def write(transport: asyncio.Transport, rid: str, last: bool, text: bytes) -> None:
        if last:  # text: the completion token count
            transport.write(chunk(b'data: {"id":"%s","choices":[],"usage":{"completion_tokens":%s}}\n\n'
                                  % (rid.encode(), text)) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        else:
            transport.write(sse(rid, text.decode()))


# ---- the bench ----------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-qwen2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--json", type=Path)
    p.add_argument("--aa", action="store_true", help="also vLLM's server again, as a path of its own (A/A)")
    p.add_argument("--serve-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-edge", metavar="HOST:PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_worker:
        return asyncio.run(serve_worker(args.model))
    if args.serve_edge:
        return uvloop.run(serve_edge(args.serve_edge, CountingMuxReader))
    from services.launcher import gateway_env
    from services.worker.builtin import resolve_model_ref

    tmp = Path(tempfile.mkdtemp(prefix="mship-mux-bench-"))
    vllm_port = eo.free_port()
    procs = [eo.start_vllm_server(resolve_model_ref(args.model), vllm_port, tmp / "vllm.log")]
    try:
        worker = eo.start_server([sys.executable, __file__, "--serve-worker", "--model", args.model],
                                 tmp / "worker.log")
        procs.append(worker)
        eo.wait_http(f"http://127.0.0.1:{vllm_port}/health", procs[0])
        _, infer_port, mux_port = eo.first_line(worker, tmp / "worker.log", "ports ", 600).split()
        urls = {"vllm-http": f"http://127.0.0.1:{vllm_port}"} | (
            {"vllm-again": f"http://127.0.0.1:{vllm_port}"} if args.aa else {})
        edges = {}
        for name, cmd in (("floor", [str(ROOT / "bench" / "edge_floor.py"), f"127.0.0.1:{infer_port}"]),
                          ("mux", [__file__, "--serve-edge", f"127.0.0.1:{mux_port}"])):
            edges[name] = eo.start_server([sys.executable, *cmd], tmp / f"{name}.log", gateway_env())
            procs.append(edges[name])
            urls[name] = eo.first_line(edges[name], tmp / f"{name}.log", "http")
        worker_proc, api_server = psutil.Process(worker.pid), psutil.Process(procs[0].pid)
        floor_edge, mux_edge = psutil.Process(edges["floor"].pid), psutil.Process(edges["mux"].pid)
        meters = {"vllm-server": eo.CpuMeter([api_server]),
                  "vllm-api-server": eo.CpuMeter([api_server], children=False),
                  "worker-front-end": eo.CpuMeter([worker_proc], children=False),
                  "floor-edge": eo.CpuMeter([floor_edge]), "mux-edge": eo.CpuMeter([mux_edge]),
                  "floor-path": eo.CpuMeter([worker_proc, floor_edge]),
                  "mux-path": eo.CpuMeter([worker_proc, mux_edge])}
        table = asyncio.run(measure_all(args, urls, meters))
    finally:
        stop_processes(list(reversed(procs)))
    report(table)
    if args.json:
        write_json(args.json, args, table=table)


async def measure_all(args: argparse.Namespace, urls: dict[str, str], meters: dict) -> dict:
    async with contextlib.AsyncExitStack() as stack:
        paths = {name: functools.partial(eo.sse_stream, await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, timeout=120, limits=eo.CLIENT_LIMITS))) for name, url in urls.items()}
        quiet = eo.Quiet()
        await eo.measure(paths, meters, 4, 5, 16, quiet)  # warm up
        return {str(c): await eo.measure(paths, meters, c, max(args.rounds, -(-30 // c)), args.tokens, quiet)
                for c in (1, 8, 32)}


def report(table: dict) -> None:
    print(f"{'streams':>7} {'path':<10} {'TTFT p50 ms':>12} {'tok/s':>8} {'share':>7} {'front end us/tok':>17} "
          f"{'edge us/tok':>12}")
    for c, rows in table.items():
        for name, r in rows.items():
            edge = f"{r['edge_cpu_us_per_token']:.0f}" if "edge_cpu_us_per_token" in r else "-"
            share = 100 * eo.throughput_ratio(r, rows["vllm-http"])
            print(f"{c:>7} {name:<10} {r['ttft_p50_ms']:>12.2f} {r['tok_s']:>8.0f} {share:>6.1f}% "
                  f"{r['front_end_cpu_us_per_token']:>17.0f} {edge:>12}")


if __name__ == "__main__":
    unwind_on_signals()
    main()
