"""The llama_cpp loader's two runtimes side by side: `server` (llama-server subprocess) and
`in_process` (xllamacpp in the worker's own process), the same GGUF, the same slots.

Each runtime gets its own worker process (this script with --serve), driven over the worker's gRPC
`Infer`. Rounds interleave (server, in_process / in_process, server) so drift on a busy machine
hits both; tokens/s at 1 and 4 concurrent streams (p50 over rounds), time to first token (p50 over
streams), and the resident memory of each worker process (total: plus its llama-server child), the most
sampled after a round.

  .venv/bin/python bench/llama_runtimes.py [--tokens 64] [--rounds 4] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import psutil

from bench.loaders import llama_bench_parser, mship_stream
from bench.report import pct, unwind_on_signals, write_json
from mship.common.v1 import common_pb2
from mship.worker.v1 import worker_pb2_grpc

SLOTS = 4
RUNTIMES = ("server", "in_process")
MIB = 2**20


def model_spec(args: argparse.Namespace, runtime: str) -> common_pb2.ModelSpec:
    return common_pb2.ModelSpec(name="bench", model=args.model, loader=common_pb2.LOADER_LLAMA_CPP,
                                max_model_len=2048, max_num_seqs=SLOTS, num_cpus=args.threads,
                                llama_cpp=common_pb2.LlamaCppOptions(runtime=runtime))


async def serve(args: argparse.Namespace) -> None:
    """--serve RUNTIME: one worker; prints its port once the model is loaded, stops at stdin's end."""
    from services.worker.server import start_worker_server

    worker = await start_worker_server(model_spec(args, args.serve), "127.0.0.1", 0)
    await worker.host.wait_ready()
    print(f"port {worker.port}", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await worker.stop(grace_s=1)


class Worker:
    def __init__(self, args: argparse.Namespace, runtime: str, log_dir: Path) -> None:
        self.runtime, self.log = runtime, log_dir / f"{runtime}.log"
        cmd = [sys.executable, __file__, "--serve", runtime, "--model", args.model, "--threads", str(args.threads)]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        self.rss_worker = self.rss_total = 0

    def wait_port(self) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"{self.runtime} worker did not start:\n{self.log.read_text()[-2000:]}")
        return int(line.split()[1])

    def sample_rss(self) -> None:
        me = psutil.Process(self.proc.pid)
        worker = me.memory_info().rss
        children = sum(c.memory_info().rss for c in me.children(recursive=True))
        self.rss_worker, self.rss_total = max(self.rss_worker, worker), max(self.rss_total, worker + children)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def run(stub: worker_pb2_grpc.WorkerStub, streams: int, tokens: int) -> tuple[float, list[float]]:
    """(tokens/s over all streams, each stream's TTFT in ms)."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*[mship_stream(stub, tokens, i) for i in range(streams)])
    wall = time.perf_counter() - t0
    return sum(n for _, n in results) / wall, [1000 * t for t, _ in results]


async def main(args: argparse.Namespace) -> None:
    tps: dict[str, dict[int, list[float]]] = {rt: {1: [], SLOTS: []} for rt in RUNTIMES}
    ttft: dict[str, dict[int, list[float]]] = {rt: {1: [], SLOTS: []} for rt in RUNTIMES}
    workers: dict[str, Worker] = {}
    channels: list[grpc.aio.Channel] = []
    with tempfile.TemporaryDirectory(prefix="mship-bench-") as logs:
        try:
            stubs, load_s = {}, {}
            for rt in RUNTIMES:  # one at a time: a load does not compete with the other's
                t0 = time.perf_counter()
                workers[rt] = Worker(args, rt, Path(logs))
                port = await asyncio.to_thread(workers[rt].wait_port)
                load_s[rt] = time.perf_counter() - t0
                channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
                stubs[rt] = worker_pb2_grpc.WorkerStub(channels[-1])
                for streams in (1, SLOTS):  # warm
                    await run(stubs[rt], streams, args.tokens)
            for r in range(args.rounds):
                order = list(RUNTIMES) if r % 2 == 0 else list(reversed(RUNTIMES))
                for streams in (1, SLOTS):
                    for rt in order:
                        rate, firsts = await run(stubs[rt], streams, args.tokens)
                        tps[rt][streams].append(rate)
                        ttft[rt][streams].extend(firsts)
                        workers[rt].sample_rss()
        finally:
            for channel in channels:
                await channel.close()
            for w in workers.values():
                w.stop()
    print(f"{args.model}, {args.tokens} tokens per stream, {args.threads} thread(s), {args.rounds} rounds (p50)")
    print(f"{'':<11}{'tok/s x1':>9}{'tok/s x4':>9}{'TTFT x1 ms':>11}{'TTFT x4 ms':>11}"
          f"{'worker MiB':>11}{'total MiB':>11}{'start s':>8}")
    p50: dict[str, dict[str, float]] = {}
    for rt in RUNTIMES:
        w = workers[rt]
        p50[rt] = {f"tps_{s}": pct(tps[rt][s], 50) for s in (1, SLOTS)} | {
            f"ttft_ms_{s}": pct(ttft[rt][s], 50) for s in (1, SLOTS)} | {
            "rss_worker_mib": w.rss_worker / MIB, "rss_total_mib": w.rss_total / MIB, "start_s": load_s[rt]}
        row = p50[rt]
        print(f"{rt:<11}{row['tps_1']:>9.1f}{row['tps_4']:>9.1f}{row['ttft_ms_1']:>11.1f}{row['ttft_ms_4']:>11.1f}"
              f"{row['rss_worker_mib']:>11.0f}{row['rss_total_mib']:>11.0f}{row['start_s']:>8.1f}")
    a, b = p50["in_process"], p50["server"]
    for s in (1, SLOTS):
        print(f"in_process / server throughput x{s}: {100 * a[f'tps_{s}'] / b[f'tps_{s}']:.1f}%  "
              f"TTFT {a[f'ttft_ms_{s}'] - b[f'ttft_ms_{s}']:+.1f} ms")
    print(f"memory (worker + llama-server): in_process {a['rss_total_mib'] - b['rss_total_mib']:+.0f} MiB")
    if args.json:
        write_json(Path(args.json), args, p50=p50, tps={k: {str(s): v for s, v in by.items()} for k, by in tps.items()},
                   ttft_ms={k: {str(s): v for s, v in by.items()} for k, by in ttft.items()})


if __name__ == "__main__":
    unwind_on_signals()
    parser = llama_bench_parser(__doc__)
    parser.add_argument("--serve", choices=RUNTIMES, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    asyncio.run(serve(parsed) if parsed.serve else main(parsed))
