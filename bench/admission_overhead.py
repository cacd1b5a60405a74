"""What authentication and rate limits add to time to first token, side by side in one run:

  open     no keys, no limits (the edge as it runs without tenancy)
  memory   an API key checked + request and token limits in this replica's memory
  redis    the same limits in a real Redis (one Lua call to admit, one to settle)

Each path is the real edge (app + uvicorn, `tests/unit/gateway_harness.Gateway`) in front of the
same real worker servicer around the engine double, so the difference between paths is the edge's
own work. Rounds interleave the paths; TTFT (request sent -> first SSE chunk) p50/p99 per path and
the added p50 against `open`. Targets (issue 19): memory <= +0.2 ms p50, redis <= +1 ms p50.

  .venv/bin/python bench/admission_overhead.py [--requests 300] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.report import pct, write_json
from services.gateway.identity import ApiKeys, Authenticator
from tests.engine_double import ScriptedEngine, serve_worker
from tests.redis_server import RedisServer
from tests.unit.gateway_harness import CHAT, SCRIPT, Gateway

KEY = "bench-key"
LIMITS = {"requests_per_minute": 10**8, "tokens_per_minute": 10**9}  # never refused: the cost of checking


async def ttft(client: httpx.AsyncClient, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers) as r:
        assert r.status_code == 200, r.status_code
        first = None
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter()
    assert first is not None
    return first - t0


async def main_async(args: argparse.Namespace) -> dict:
    worker = await serve_worker(ScriptedEngine(SCRIPT, max_model_len=256))
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        keyed = Authenticator(ApiKeys(f"{KEY}:bench"))
        gateways = {"open": Gateway(),
                    "memory": Gateway(authenticator=keyed),
                    "redis": Gateway(authenticator=keyed, rate_store=redis.url)}
        headers = {"open": {}, "memory": {"authorization": f"Bearer {KEY}"},
                   "redis": {"authorization": f"Bearer {KEY}"}}
        samples: dict[str, list[float]] = {name: [] for name in gateways}
        try:
            for name, gw in gateways.items():
                limited = name != "open"
                await gw.route(worker.address, requests_per_minute=LIMITS["requests_per_minute"] if limited else 0,
                               tokens_per_minute=LIMITS["tokens_per_minute"] if limited else 0)
            clients = {name: httpx.AsyncClient(base_url=gw.url, timeout=30) for name, gw in gateways.items()}
            for name in gateways:  # warm up: connections, first-call paths, Lua script load
                for _ in range(20):
                    await ttft(clients[name], headers[name])
            for round_ in range(args.rounds):
                order = list(gateways) if round_ % 2 == 0 else list(reversed(gateways))
                for _ in range(args.requests):
                    for name in order:
                        samples[name].append(await ttft(clients[name], headers[name]))
            for c in clients.values():
                await c.aclose()
        finally:
            for gw in gateways.values():
                await gw.stop()
            await worker.server.stop(0)
            redis.stop()
    base = pct(samples["open"], 50)
    rows = {name: {"ttft_p50_ms": pct(v, 50) * 1e3, "ttft_p99_ms": pct(v, 99) * 1e3,
                   "added_p50_ms": (pct(v, 50) - base) * 1e3, "n": len(v)} for name, v in samples.items()}
    print(f"{'path':8} {'n':>6} {'TTFT p50 ms':>12} {'p99 ms':>8} {'added p50 ms':>13}")
    for name, row in rows.items():
        print(f"{name:8} {row['n']:>6} {row['ttft_p50_ms']:>12.3f} {row['ttft_p99_ms']:>8.3f} "
              f"{row['added_p50_ms']:>+13.3f}")
    print("targets: memory <= +0.200 ms p50, redis <= +1.000 ms p50")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    if args.json:
        write_json(args.json, args, paths=rows)


if __name__ == "__main__":
    main()
