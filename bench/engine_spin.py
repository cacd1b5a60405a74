"""What vLLM's busy-wait costs the token path on a CPU node: the same platform with different
`MSHIP_ENGINE_SPIN_S` (how long the engine's processes spin between steps before they sleep),
side by side in one run, interleaved, at 1, 8 and 32 streams of streamed chat through the gateway.

vLLM's shared-memory queue readers (EngineCore waiting for its model worker, the worker waiting for
EngineCore) spin with sched_yield for a second after each read. On a CPU node the model computes on
the same cores as the gateway and worker replicas, so every spinning millisecond is one they wait
for. Prints throughput, TTFT and inter-token p50 per setting, and the CPU per generated token of the
engine processes and of the whole platform. 1 is vLLM's own setting.

  .venv/bin/python bench/engine_spin.py [--spin-s 1 0.003 0] [--rounds 3] [--tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.edge_overhead import MAX_MODEL_LEN, MAX_NUM_SEQS, MODEL, CpuMeter, Quiet, sse_stream  # noqa: E402
from bench.report import pct, unwind_on_signals, write_json  # noqa: E402
from services.common.vocabulary import ENV_ENGINE_SPIN_S  # noqa: E402
from tests.platform_process import PlatformProcess  # noqa: E402

ENGINE = ("VLLM::EngineCore", "VLLM::Worker")


def engine_meter(platform: PlatformProcess) -> CpuMeter:
    return CpuMeter([p for name in ENGINE for p in platform.find(name)])


async def measure(platforms: dict[str, PlatformProcess], concurrency: int, rounds: int, tokens: int,
                  quiet: Quiet) -> dict:
    meters = {k: (CpuMeter([psutil.Process(p.proc.pid)]), engine_meter(p)) for k, p in platforms.items()}
    samples = {k: {"ttft": [], "itl": [], "rate": [], "tokens": 0, "cpu": 0.0, "engine_cpu": 0.0} for k in platforms}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    clients = {k: httpx.AsyncClient(base_url=p.base_url, timeout=120, limits=limits) for k, p in platforms.items()}
    try:
        for _ in range(rounds):
            for k, http in clients.items():  # interleaved: drift on the box hits every setting alike
                quiet.wait()  # the previous setting's engine has stopped spinning
                await asyncio.gather(*[sse_stream(http, 8) for _ in range(concurrency)])  # wake it up
                whole, engine = meters[k]
                cpu0, engine0, t0 = whole.seconds(), engine.seconds(), time.perf_counter()
                results = await asyncio.gather(*[sse_stream(http, tokens) for _ in range(concurrency)])
                wall = time.perf_counter() - t0
                s = samples[k]
                s["cpu"] += whole.seconds() - cpu0
                s["engine_cpu"] += engine.seconds() - engine0
                s["ttft"] += [r[0] * 1000 for r in results]
                s["itl"] += [g * 1000 for r in results for g in r[1]]
                s["rate"].append(sum(r[2] for r in results) / wall)
                s["tokens"] += sum(r[2] for r in results)
    finally:
        for http in clients.values():
            await http.aclose()
    return {k: {"tok_s": statistics.median(s["rate"]), "ttft_p50_ms": statistics.median(s["ttft"]),
                "ttft_p99_ms": pct(s["ttft"], 99), "itl_p50_ms": statistics.median(s["itl"]),
                "itl_p99_ms": pct(s["itl"], 99), "itl_max_ms": max(s["itl"]),
                "cpu_us_per_token": 1e6 * s["cpu"] / s["tokens"],
                "engine_cpu_us_per_token": 1e6 * s["engine_cpu"] / s["tokens"]} for k, s in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spin-s", nargs="+", default=["1", "0.003", "0"], help="settings to compare (1: vLLM's own)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still stops the platforms it started
    tmp = Path(tempfile.mkdtemp(prefix="mship-spin-bench-"))
    (tmp / "models.yaml").write_text(f"models:\n  - name: {MODEL}\n    model: builtin:tiny-qwen2\n"
                                     f"    max_model_len: {MAX_MODEL_LEN}\n    max_num_seqs: {MAX_NUM_SEQS}\n")
    platforms: dict[str, PlatformProcess] = {}
    try:
        for spin in args.spin_s:  # one after another: Ray clusters starting at once on 2 cores can fail to register
            platforms[spin] = PlatformProcess.start(tmp / "models.yaml", tmp / f"mship-{spin}.log", gateway_replicas=1,
                                                    env={ENV_ENGINE_SPIN_S: spin})
            platforms[spin].wait_ready()
        quiet = Quiet()  # before any traffic: every engine has been idle since it started
        asyncio.run(measure(platforms, 4, 2, 16, quiet))  # warm up connections and engines
        table = {str(c): asyncio.run(measure(platforms, c, max(args.rounds, -(-30 // c)), args.tokens, quiet))
                 for c in (1, 8, 32)}
    finally:
        for platform in platforms.values():
            platform.stop()
    print(f"{'streams':>7} {'spin s':>7} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'ITL max':>8} {'CPU us/tok':>11} {'engine us/tok':>14}")
    for c, rows in table.items():
        for spin, r in rows.items():
            print(f"{c:>7} {spin:>7} {r['tok_s']:>7.0f} {r['ttft_p50_ms']:>9.2f} {r['ttft_p99_ms']:>9.2f} "
                  f"{r['itl_p50_ms']:>8.2f} {r['itl_p99_ms']:>8.2f} {r['itl_max_ms']:>8.1f} "
                  f"{r['cpu_us_per_token']:>11.0f} {r['engine_cpu_us_per_token']:>14.0f}")
    if args.json:
        write_json(args.json, args, table=table)


if __name__ == "__main__":
    unwind_on_signals()
    main()
