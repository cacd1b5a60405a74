"""What the gateway alone spends per streamed token: the real edge (`create_app` on the
`ReusePortServer`, as in the unit tier's harness, with the environment a gateway replica gets) in
its own process, in front of a real worker gRPC server in another, whose engine double steps every
stream on one clock like a batched engine. No model and no Ray: the CPU columns are the gateway's
and the worker servicer's own, so a change on the token path shows in one run, not in the noise of
an engine sharing the cores. The TTFT p50 column is each edge's time to the first token; at 1
stream the double answers one step after the request, so the difference between two edges is their
own per-request latency.

`--tree` runs one gateway per source tree (e.g. a `git worktree` of the previous commit and this
one), all in front of the same worker, interleaved round by round: a before/after side by side.
`--floor` adds two floors beside them, edges that do nothing but carry tokens: bench/edge_floor.py
(one Infer stream per request, the platform's contract: the least any separate Python edge spends
per token under it) and bench/mux_floor.py (one stream per worker carrying every request's deltas
in one message per step, in front of a multiplexing worker toy of its own). `--repeat N` has each
stream make N chats in turn per round: with `--tokens 1`, the CPU columns are per request.

  .venv/bin/python bench/gateway_cpu.py [--tree . --tree /tmp/base] [--floor] [--step-ms 4] [--tokens 256]
                                        [--rounds 5] [--repeat 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TREE_ENV = "MSHIP_BENCH_TREE"  # the source tree a spawned gateway runs from (an older one need not have this file)
sys.path.insert(0, os.environ.get(TREE_ENV, str(ROOT)))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.report import stop_processes, unwind_on_signals, write_json  # noqa: E402

MODEL = "m"  # what tests/unit/gateway_harness.py routes


def stepped_engine(tokens: int, step_s: float) -> Any:  # the double's classes import in the worker process only
    """The unit tier's engine double, answering `tokens` tokens, one per step of a clock shared by
    all streams (the tokens of one step leave together, as from a batched engine)."""
    from services.worker.engine import ChoiceDelta, StepOutput
    from tests.engine_double import ScriptedEngine

    class SteppedEngine(ScriptedEngine):
        def __init__(self) -> None:
            super().__init__([" tok"] * tokens, max_model_len=4096)
            self._next: asyncio.Future[None] | None = None

        async def _step(self) -> None:
            if self._next is None or self._next.done():
                loop = asyncio.get_running_loop()
                self._next = loop.create_future()
                loop.call_later(step_s, self._next.set_result, None)
            await asyncio.shield(self._next)  # a cancelled stream must not cancel everyone's step

        async def generate(self, prompt, sampling, request_id, priority=0) -> AsyncIterator[StepOutput]:
            for i, chunk in enumerate(self.script):
                await self._step()
                last = i == len(self.script) - 1
                yield StepOutput([ChoiceDelta(0, chunk, 1, finish_reason="stop" if last else None)], last,
                                 len(prompt.token_ids), 0)

    return SteppedEngine()


async def run_worker(port: int, tokens: int, step_s: float) -> None:
    from tests.engine_double import serve_worker

    worker = await serve_worker(stepped_engine(tokens, step_s), name=MODEL, max_ongoing=64, port=port)
    print("ready", flush=True)
    await worker.server.wait_for_termination()  # (held: a collected grpc.aio server stops listening)


async def run_mux_worker(port: int, step_s: float) -> None:
    from bench.mux_floor import serve_worker

    server = await serve_worker(port, step_s)
    print("ready", flush=True)
    await server.wait_for_termination()


async def run_gateway(worker: str) -> None:
    from tests.unit.gateway_harness import Gateway

    gateway = Gateway(max_body_bytes=1 << 20)
    await gateway.route(worker)
    print(gateway.url, flush=True)
    await asyncio.Event().wait()  # `gateway` serves from its own thread meanwhile


def spawn(*args: str, tree: Path = ROOT, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """This file's `args` role, importing from source `tree`, with `env` on top of this process's;
    returns it and the first line it prints."""
    proc = subprocess.Popen([sys.executable, __file__, *args], cwd=tree,
                            env={**os.environ, **(env or {}), TREE_ENV: str(tree)},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def stream(http: httpx.AsyncClient, tokens: int) -> tuple[int, float]:
    """The tokens one streamed chat got, and its time to the first token (s)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    n, t0, ttft = 0, time.perf_counter(), 0.0
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith('data: {"id"') and '"content":" tok"' in line:
                n += 1
                ttft = ttft or time.perf_counter() - t0
    return n, ttft


async def streams(http: httpx.AsyncClient, tokens: int, repeat: int) -> list[tuple[int, float]]:
    """`repeat` streamed chats one after another."""
    return [await stream(http, tokens) for _ in range(repeat)]


async def measure(gateways: dict[str, tuple[psutil.Process, str, psutil.Process]], concurrency: int,
                  rounds: int, tokens: int, repeat: int = 1) -> dict[str, dict[str, float]]:
    cpu = {name: {"gateway": 0.0, "worker": 0.0, "tokens": 0, "rate": [], "ttft": []} for name in gateways}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    clients = {name: httpx.AsyncClient(base_url=edge[1], timeout=60, limits=limits) for name, edge in gateways.items()}
    try:
        for http in clients.values():  # connections open, code paths warm
            await asyncio.gather(*[stream(http, 4) for _ in range(concurrency)])
        for _ in range(rounds):
            for name, http in clients.items():  # interleaved: drift on the box hits every tree alike
                proc, _, worker = gateways[name]
                g0, w0, t0 = sum(proc.cpu_times()[:2]), sum(worker.cpu_times()[:2]), time.perf_counter()
                done = [one for many in await asyncio.gather(*[streams(http, tokens, repeat)
                                                               for _ in range(concurrency)]) for one in many]
                wall, n = time.perf_counter() - t0, sum(tokens for tokens, _ in done)
                c = cpu[name]
                c["ttft"] += [ttft for _, ttft in done]
                c["gateway"] += sum(proc.cpu_times()[:2]) - g0
                c["worker"] += sum(worker.cpu_times()[:2]) - w0
                c["tokens"] += n
                c["rate"].append(n / wall)
    finally:
        for http in clients.values():
            await http.aclose()
    return {name: {"gateway_cpu_us_per_token": 1e6 * c["gateway"] / c["tokens"],
                   "worker_cpu_us_per_token": 1e6 * c["worker"] / c["tokens"],
                   "tok_s": statistics.median(c["rate"]),
                   "ttft_p50_ms": 1e3 * statistics.median(c["ttft"])} for name, c in cpu.items()}


def run_role(role: str, args: list[str]) -> None:
    """One spawned process: the worker, a gateway, or a floor's edge or worker (bench/*_floor.py)."""
    if role == "gateway":
        return asyncio.run(run_gateway(args[0]))
    import uvloop

    from bench import edge_floor, mux_floor

    uvloop.run({"worker": lambda: run_worker(int(args[0]), int(args[1]), float(args[2])),
                "floor": lambda: edge_floor.serve(args[0]),
                "mux-floor": lambda: mux_floor.serve_edge(args[0]),
                "mux-worker": lambda: run_mux_worker(int(args[0]), float(args[1]))}[role]())


def main() -> None:
    if sys.argv[1:2] and not sys.argv[1].startswith("-"):
        return run_role(sys.argv[1], sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, action="append", help="a source tree to run a gateway from (default: this one)")
    p.add_argument("--floor", action="store_true", help="also the floors: bench/edge_floor.py, bench/mux_floor.py")
    p.add_argument("--step-ms", type=float, default=4.0, help="the double's engine step")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=1, help="chats each stream makes in turn per round "
                   "(with --tokens 1: the per-request cost)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from services.launcher import gateway_env
    from tests.platform_process import free_port

    trees = [t.resolve() for t in args.tree or [ROOT]]
    port = free_port()
    procs = []
    try:
        worker, ready = spawn("worker", str(port), str(args.tokens), str(args.step_ms / 1000))
        procs.append(worker)
        if ready != "ready":
            raise RuntimeError("the worker did not start")
        gateways = {}
        real_worker = psutil.Process(worker.pid)
        for i, tree in enumerate(trees):
            gateway, url = spawn("gateway", f"127.0.0.1:{port}", tree=tree, env=gateway_env())  # as a replica's
            procs.append(gateway)
            if not url.startswith("http"):
                raise RuntimeError(f"the gateway from {tree} did not start")
            gateways[f"{i}:{tree}"] = (psutil.Process(gateway.pid), url, real_worker)
        if args.floor:
            mux_port = free_port()
            mux_worker, ready = spawn("mux-worker", str(mux_port), str(args.step_ms / 1000))
            procs.append(mux_worker)
            if ready != "ready":
                raise RuntimeError("the multiplexing worker did not start")
            for role, name, address, behind in (
                    ("floor", "floor: Infer per request", port, real_worker),
                    ("mux-floor", "floor: multiplexed", mux_port, psutil.Process(mux_worker.pid))):
                edge, url = spawn(role, f"127.0.0.1:{address}", env=gateway_env())
                procs.append(edge)
                if not url.startswith("http"):
                    raise RuntimeError(f"the {name} edge did not start")
                gateways[name] = (psutil.Process(edge.pid), url, behind)
        table = {str(c): asyncio.run(measure(gateways, c,
                                             max(args.rounds, -(-30 // c)), args.tokens, args.repeat))
                 for c in (1, 8, 32)}
    finally:
        stop_processes(procs, grace_s=10)
    print(f"{'streams':>7} {'edge':<40} {'tok/s':>7} {'gateway us/tok':>15} {'worker us/tok':>14} {'TTFT p50 ms':>12}")
    for c, rows in table.items():
        for name, r in rows.items():
            print(f"{c:>7} {name[-40:]:<40} {r['tok_s']:>7.0f} {r['gateway_cpu_us_per_token']:>15.1f} "
                  f"{r['worker_cpu_us_per_token']:>14.1f} {r['ttft_p50_ms']:>12.2f}")
    if args.json:
        write_json(args.json, args, table=table)


if __name__ == "__main__":
    unwind_on_signals()
    main()
