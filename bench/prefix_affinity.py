"""Prefix-affinity routing against least-outstanding routing, side by side in one run.

A real platform (`mship start`) serves builtin:tiny-qwen2 on vLLM with 2 replicas, each with a KV
cache that holds about `--cache-share` of the identities' system prompts (so where a prompt goes
decides whether its prefix is still cached). Every identity has its own ~1,000-token system prompt
and asks short questions. Two Python clients watch the same routing table and call the same
replicas, one with `PrefixAffinity`, one with `LeastOutstanding`; their identities are disjoint
(distinct cache salts: neither warms the other's prefixes) and their rounds alternate, so the
machine's noise falls on both alike. Reported per picker: the cached share of prompt tokens (from
the engines' own usage) and time to first token.

  .venv/bin/python bench/prefix_affinity.py [--identities 12] [--rounds 20] [--concurrency 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

from bench.report import pct, unwind_on_signals, write_json  # noqa: E402
from clients.client import MshipClient  # noqa: E402
from services.common.picker import LeastOutstanding, PrefixAffinity, ReplicaPicker  # noqa: E402
from services.worker.builtin.corpus import UNSEEN_PROMPTS  # noqa: E402
from tests.platform_process import PlatformProcess  # noqa: E402

MODEL = "affinity"
KV_BYTES_PER_TOKEN = 4 * 2 * 4 * 32 * 2  # tiny-qwen2: layers x (K, V) x kv heads x head dim x bf16
SYSTEM_WORDS = ("the a of to in is you that it he was for on are as with his they at be this have from or one had "
                "by word but not what all were we when your can said there use an each which she do how their if "
                "will up other about out many then them these so some her would make like him into time has look "
                "two more write go see number no way could people my than first water been call who oil its now "
                "find long down day did get come made may part").split()


def system_prompt(rng: random.Random, words: int) -> str:
    return "You are the assistant of one customer. " + " ".join(rng.choice(SYSTEM_WORDS) for _ in range(words))


async def one_call(client: MshipClient, identity: str, system: str, question: str) -> tuple[float, int, int]:
    """(TTFT in s, prompt tokens, cached tokens) of one streamed chat."""
    t0 = time.perf_counter()
    ttft = None
    usage = None
    async for event in client.stream_chat(MODEL, [{"role": "system", "content": system},
                                                  {"role": "user", "content": question}],
                                          cache_salt=identity, max_tokens=4, temperature=0.0):
        if ttft is None:
            ttft = time.perf_counter() - t0
        if event.HasField("final"):
            usage = event.final.usage
    assert ttft is not None and usage is not None
    return ttft, usage.prompt_tokens, usage.cached_tokens


async def run(coordinator: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    rng = random.Random(0)
    pickers: dict[str, ReplicaPicker] = {"prefix_affinity": PrefixAffinity(), "least_outstanding": LeastOutstanding()}
    identities = {name: {f"{name}-{i}": system_prompt(rng, args.system_words) for i in range(args.identities)}
                  for name in pickers}
    samples: dict[str, list[tuple[float, int, int]]] = {name: [] for name in pickers}
    clients = {name: MshipClient(coordinator, picker=picker) for name, picker in pickers.items()}
    for client in clients.values():
        await client.__aenter__()
    try:
        for round_no in range(args.rounds):
            order = list(pickers) if round_no % 2 == 0 else list(reversed(pickers))
            for name in order:
                chosen = [rng.choice(list(identities[name])) for _ in range(args.concurrency)]
                results = await asyncio.gather(*(
                    one_call(clients[name], who, identities[name][who], rng.choice(UNSEEN_PROMPTS)) for who in chosen))
                if round_no >= args.warmup_rounds:
                    samples[name] += results
    finally:
        for client in clients.values():
            await client.__aexit__(None, None, None)
    out = {}
    for name, got in samples.items():
        ttfts = [s[0] for s in got]
        out[name] = {"requests": len(got), "cached_share": sum(s[2] for s in got) / max(1, sum(s[1] for s in got)),
                     "ttft_p50_ms": 1000 * pct(ttfts, 50), "ttft_p99_ms": 1000 * pct(ttfts, 99),
                     "prompt_tokens_mean": sum(s[1] for s in got) / max(1, len(got))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--identities", type=int, default=12, help="per picker, each with its own system prompt")
    p.add_argument("--system-words", type=int, default=900, help="words of each system prompt (~1,000 tokens)")
    p.add_argument("--cache-share", type=float, default=0.75,
                   help="of one picker's identities whose prompts fit in one replica's KV cache")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup-rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    # Both pickers' identities share each replica's cache; tokens of a prompt ~ 1.2 per word.
    kv_bytes = int(2 * args.identities * args.cache_share * args.system_words * 1.2 * KV_BYTES_PER_TOKEN)
    tmp = Path(tempfile.mkdtemp(prefix="mship-affinity-bench-"))
    config = tmp / "models.yaml"
    config.write_text(f"models:\n  - name: {MODEL}\n    model: builtin:tiny-qwen2\n    max_model_len: 2048\n"
                      f"    max_num_seqs: 4\n    num_cpus: 0.5\n    num_replicas: 2\n"
                      f"    engine_args: {{kv_cache_memory_bytes: {kv_bytes}}}\n")
    platform = PlatformProcess.start(config, tmp / "mship.log", gateway_replicas=1)
    try:
        platform.wait_ready()
        result = asyncio.run(run(platform.coordinator, args))
    finally:
        platform.stop()
    print(f"2 replicas, {args.identities} identities per picker with ~{args.system_words}-word system prompts, "
          f"KV cache per replica {kv_bytes / 2**20:.0f} MiB; {args.rounds - args.warmup_rounds} measured rounds of "
          f"{args.concurrency} concurrent calls per picker, alternating; load avg {os.getloadavg()[0]:.1f}")
    print(f"{'picker':>18} {'requests':>8} {'cached share':>12} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11}")
    for name, r in result.items():
        print(f"{name:>18} {r['requests']:>8} {r['cached_share']:>12.1%} {r['ttft_p50_ms']:>11.1f} "
              f"{r['ttft_p99_ms']:>11.1f}")
    if args.json:
        write_json(args.json, args, result=result, kv_cache_bytes=kv_bytes)


if __name__ == "__main__":
    unwind_on_signals()
    main()
