"""What the edge's metrics cost, side by side in one run:

  off   the edge with `--no-metrics` (no metrics middleware, nothing recorded per request)
  on    the edge recording its series (docs/metrics.md) in a multiprocess metrics directory, as
        in a platform (prometheus_client's mmap files)

Each path is the real edge (app + uvicorn, `tests/unit/gateway_harness.Gateway`) in front of the
same real worker servicer around the engine double (TOKENS events per stream), so the difference is
the edge's own work. Rounds interleave the paths. Per path: TTFT (request sent -> first SSE chunk)
p50/p99, and the CPU this process spends per streamed token (edge, worker double and client share
the process, so the difference between the paths is the metrics' cost). Targets (issue 14): on <= +2%
CPU per token and <= +0.1 ms TTFT p50 over off.

  .venv/bin/python bench/metrics_overhead.py [--requests 200] [--rounds 3] [--tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# The multiprocess directory must be set before prometheus_client is imported (it picks its value
# backend at import), as a platform node's environment does.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="mship-bench-metrics-"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio

import httpx

from bench.report import pct, write_json
from tests.engine_double import ScriptedEngine, serve_worker
from tests.unit.gateway_harness import CHAT, Gateway


async def stream(client: httpx.AsyncClient) -> tuple[float, int]:
    """(TTFT, streamed chunks) of one streamed chat."""
    t0 = time.perf_counter()
    first, chunks = None, 0
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200, r.status_code
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                first = first or time.perf_counter()
                chunks += 1
    assert first is not None
    return first - t0, chunks


async def main_async(args: argparse.Namespace) -> dict:
    worker = await serve_worker(ScriptedEngine([f" t{i}" for i in range(args.tokens)], max_model_len=4096))
    gateways = {"off": Gateway(metrics=False), "on": Gateway(metrics=True)}
    ttfts: dict[str, list[float]] = {name: [] for name in gateways}
    cpu = dict.fromkeys(gateways, 0.0)
    tokens = dict.fromkeys(gateways, 0)
    try:
        for gw in gateways.values():
            await gw.route(worker.address)
        clients = {name: httpx.AsyncClient(base_url=gw.url, timeout=30) for name, gw in gateways.items()}
        for name in gateways:  # warm up
            for _ in range(20):
                await stream(clients[name])
        for round_ in range(args.rounds):
            for name in (list(gateways) if round_ % 2 == 0 else list(reversed(gateways))):
                c0 = time.process_time()
                for _ in range(args.requests):
                    ttft, n = await stream(clients[name])
                    ttfts[name].append(ttft)
                    tokens[name] += n
                cpu[name] += time.process_time() - c0
        for c in clients.values():
            await c.aclose()
    finally:
        for gw in gateways.values():
            await gw.stop()
        await worker.server.stop(0)
    rows = {name: {"ttft_p50_ms": pct(v, 50) * 1e3, "ttft_p99_ms": pct(v, 99) * 1e3,
                   "cpu_us_per_token": cpu[name] / tokens[name] * 1e6, "requests": len(v)}
            for name, v in ttfts.items()}
    off = rows["off"]
    print(f"{args.tokens} tokens per stream, {args.requests} streams x {args.rounds} rounds per path; "
          f"load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'path':5} {'TTFT p50 ms':>12} {'p99 ms':>8} {'CPU us/token':>13} {'vs off':>8}")
    for name, row in rows.items():
        print(f"{name:5} {row['ttft_p50_ms']:>12.3f} {row['ttft_p99_ms']:>8.3f} {row['cpu_us_per_token']:>13.1f} "
              f"{(row['cpu_us_per_token'] / off['cpu_us_per_token'] - 1) * 100:>+7.1f}%")
    print(f"added TTFT p50: {rows['on']['ttft_p50_ms'] - off['ttft_p50_ms']:+.3f} ms; "
          "targets: <= +2% CPU per token, <= +0.1 ms TTFT p50")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="streams per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        write_json(args.json, args, paths=rows)


if __name__ == "__main__":
    main()
