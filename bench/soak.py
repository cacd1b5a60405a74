"""The token path's tail under long mixed traffic: tokens that stall, then arrive in bursts.

One platform (builtin:tiny-qwen2, one gateway replica), `--minutes` of traffic (10 by default) in
rounds: each round runs every concurrency in turn (1, 4, 16 streams by default) for `--phase-s`
seconds, with an idle pause before each phase (the stalls were worst after idle). The traffic
is mixed: streamed chat (most of it, with prompts and lengths that vary), streamed Responses,
and non-streamed chat. Per concurrency it prints TTFT and inter-token gap p50 / p99 / p99.9, the
worst gap, and the stall count (gaps over 10x that concurrency's gap p50). The targets (issue 18):
TTFT p99 <= 3x p50 at each concurrency, and no gap over 250 ms at 1 stream.

  .venv/bin/python bench/soak.py [--minutes 10] [--phase-s 20] [--idle-s 3] [--concurrency 1 4 16]
                                 [--trace-stalls N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.report import pct, unwind_on_signals, write_json  # noqa: E402
from bench.stall_trace import StallTracer  # noqa: E402
from tests.platform_process import PlatformProcess  # noqa: E402

MODEL, MAX_NUM_SEQS, MAX_MODEL_LEN = "tiny", 32, 1024
PROMPTS = ["Tell me a story.", "What color is the sky?", "What is 2 + 2?", "Why do cats purr at night?",
           "Summarise the plot of a long novel about the sea."]
STALL_FACTOR = 10


@dataclass
class Samples:
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # each gap's (start, end), monotonic
    requests: int = 0
    errors: int = 0


def chat_body(rng: random.Random, stream: bool) -> dict:
    system = [{"role": "system", "content": "You are terse. " * rng.choice((1, 20, 60))}]
    return {"model": MODEL, "messages": [*system, {"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.choice((16, 64, 128, 256)), "ignore_eos": True, "temperature": 0, "stream": stream}


async def streamed(http: httpx.AsyncClient, path: str, body: dict, marker: str) -> tuple[float, list[float]]:
    """TTFT, and the stamps (monotonic) of the chunks that carry text (`marker` in the line)."""
    t0 = time.monotonic()
    stamps: list[float] = []
    async with http.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and marker in line:
                stamps.append(time.monotonic())
    if not stamps:
        raise RuntimeError(f"no text in the stream of {path}")
    return (stamps[0] - t0) * 1000, stamps


async def one_request(http: httpx.AsyncClient, rng: random.Random, samples: Samples) -> None:
    kind = rng.random()
    samples.requests += 1
    try:
        if kind < 0.7:
            ttft, stamps = await streamed(http, "/v1/chat/completions", chat_body(rng, True), '"content":"')
        elif kind < 0.9:
            chat = chat_body(rng, True)
            body = {"model": MODEL, "input": chat["messages"][-1]["content"],
                    "instructions": chat["messages"][0]["content"], "max_output_tokens": chat["max_tokens"],
                    "temperature": 0, "stream": True, "store": False}
            ttft, stamps = await streamed(http, "/v1/responses", body, '"type":"response.output_text.delta"')
        else:  # non-streamed: load on the engine, no token timings
            (await http.post("/v1/chat/completions", json=chat_body(rng, False))).raise_for_status()
            return
    except (httpx.HTTPError, RuntimeError):
        samples.errors += 1
        return
    samples.ttft_ms.append(ttft)
    for a, b in itertools.pairwise(stamps):
        samples.gaps_ms.append((b - a) * 1000)
        samples.windows.append((a, b))


async def phase(http: httpx.AsyncClient, concurrency: int, seconds: float, rng: random.Random,
                samples: Samples) -> None:
    """`concurrency` clients, each sending its next request as soon as its last one ended."""
    end = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < end:
            await one_request(http, rng, samples)

    await asyncio.gather(*(client() for _ in range(concurrency)))


async def soak(args: argparse.Namespace, platform: PlatformProcess) -> dict[int, Samples]:
    rng = random.Random(0)
    samples = {c: Samples() for c in args.concurrency}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=platform.base_url, timeout=120, limits=limits) as http:
        await phase(http, 4, 5.0, rng, Samples())  # warm: connections, the engine's first batches
        deadline = time.monotonic() + args.minutes * 60
        while time.monotonic() < deadline:
            for c in args.concurrency:
                await asyncio.sleep(args.idle_s)  # idle on purpose: the stalls were worst after idle
                await phase(http, c, args.phase_s, rng, samples[c])
    return samples


def summarise(samples: dict[int, Samples]) -> dict[str, dict[str, float]]:
    out = {}
    for c, s in samples.items():
        gap_p50 = statistics.median(s.gaps_ms) if s.gaps_ms else float("nan")
        ttft_p50 = statistics.median(s.ttft_ms) if s.ttft_ms else float("nan")
        out[str(c)] = {
            "requests": s.requests, "errors": s.errors, "streams": len(s.ttft_ms),
            "ttft_p50_ms": ttft_p50, "ttft_p99_ms": pct(s.ttft_ms, 99), "ttft_p999_ms": pct(s.ttft_ms, 99.9),
            "ttft_p99_over_p50": pct(s.ttft_ms, 99) / ttft_p50 if s.ttft_ms else float("nan"),
            "gap_p50_ms": gap_p50, "gap_p99_ms": pct(s.gaps_ms, 99), "gap_p999_ms": pct(s.gaps_ms, 99.9),
            "gap_max_ms": max(s.gaps_ms, default=float("nan")),
            "stalls": sum(g > STALL_FACTOR * gap_p50 for g in s.gaps_ms), "gaps": len(s.gaps_ms)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--idle-s", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--trace-stalls", type=int, default=0, metavar="N",
                   help="sample every process's CPU and the token path's run-queue waits (bench/stall_trace.py) "
                        "and say who ran during the N longest gaps")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mship-soak-"))
    (tmp / "models.yaml").write_text(f"models:\n  - name: {MODEL}\n    model: builtin:tiny-qwen2\n"
                                     f"    max_model_len: {MAX_MODEL_LEN}\n    max_num_seqs: {MAX_NUM_SEQS}\n")
    platform = PlatformProcess.start(tmp / "models.yaml", tmp / "mship.log", gateway_replicas=1)
    tracer = None
    try:
        platform.wait_ready()
        tracer = StallTracer(platform.proc.pid).start() if args.trace_stalls else None
        samples = asyncio.run(soak(args, platform))
    finally:
        if tracer is not None:
            tracer.stop()
        platform.stop()
    table = summarise(samples)
    print(f"{'streams':>7} {'reqs':>6} {'err':>4} {'TTFT p50':>9} {'p99':>8} {'p99.9':>8} {'p99/p50':>8} "
          f"{'gap p50':>8} {'p99':>7} {'p99.9':>7} {'max':>7} {'stalls':>7}   (ms; stall = gap > {STALL_FACTOR}x p50)")
    for c, r in table.items():
        print(f"{c:>7} {r['requests']:>6} {r['errors']:>4} {r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>8.1f} "
              f"{r['ttft_p999_ms']:>8.1f} {r['ttft_p99_over_p50']:>8.2f} {r['gap_p50_ms']:>8.2f} "
              f"{r['gap_p99_ms']:>7.1f} {r['gap_p999_ms']:>7.1f} {r['gap_max_ms']:>7.1f} {r['stalls']:>4}/{r['gaps']}")
    stalls = []
    if tracer is not None:
        longest = sorted(((g, w, c) for c, s in samples.items() for g, w in zip(s.gaps_ms, s.windows, strict=True)),
                         reverse=True)[:args.trace_stalls]
        print(f"\nthe {len(longest)} longest gaps, and what ran meanwhile:")
        for gap, (start, end), c in longest:
            stalls.append({"gap_ms": gap, "streams": c, "explained": tracer.explain(start, end)})
            print(f"  {gap:7.1f} ms at {c} streams: {stalls[-1]['explained']}")
    if args.json:
        write_json(args.json, args, table=table, stalls=stalls)


if __name__ == "__main__":
    unwind_on_signals()
    main()
