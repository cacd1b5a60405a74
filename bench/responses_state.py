"""What stored responses cost in the state service: p50/p99 of a store write (PutResponse) and a
store read (GetResponse) through the state service over gRPC on loopback, on the memory backend and
on Redis, plus the state-side part of previous_response_id resolution on a 20-turn chain (read the
parent's snapshot, write the child's, the conversation growing each turn).

The state server runs in its own process (as in production: the gateway calls it over gRPC), one
call in flight at a time. Redis is Debian's redis-server on 127.0.0.1, AOF on (--appendfsync).

The issue's target, <= 1 ms p50 added TTFT per turn with Redis on loopback, is measured end to end
by `measure_chain_ttft`: a real platform (`mship start`, state in Redis, builtin:tiny-qwen2 with the
prefix cache off so both paths prefill the same tokens), `--turns`-turn chains over POST /v1/responses
(streamed), each turn sent twice, interleaved: once continuing with previous_response_id, once with
the whole conversation inline (store: false). The added TTFT is the paired difference per turn.

  .venv/bin/python bench/responses_state.py [--ops 2000] [--turns 20] [--e2e-chains 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402

from bench.report import pct, stop_processes, unwind_on_signals, write_json  # noqa: E402
from mship.state.v1 import state_pb2 as pb  # noqa: E402
from services.state.client import StateClient  # noqa: E402
from services.worker.builtin import corpus  # noqa: E402
from tests.platform_process import PlatformProcess, free_port  # noqa: E402

IDENTITY = "bench"


def stats(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99)}


def snapshot(rid: str, turns: int, parent: str = "") -> pb.StoredResponse:
    """A realistic snapshot: a ~1 KB response object and `turns` exchanges of conversation."""
    text = "lorem ipsum dolor sit amet " * 20
    conversation = json.dumps([{"role": r, "content": text} for _ in range(turns) for r in ("user", "assistant")])
    response = json.dumps({"id": rid, "object": "response", "status": "completed", "model": "chat",
                           "output": [{"type": "message", "id": f"msg_{rid}", "role": "assistant",
                                       "content": [{"type": "output_text", "text": text * 2}]}]})
    return pb.StoredResponse(key=pb.ResponseKey(identity=IDENTITY, response_id=rid), previous_response_id=parent,
                             response_json=response, conversation_json=conversation,
                             input_items=[pb.InputItem(id=f"in_{rid}", item_json=json.dumps(
                                 {"type": "message", "role": "user", "content": text}))])


# ---- processes ----------------------------------------------------------------------------------

def start_redis(workdir: Path, appendfsync: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
                             "--save", "", "--appendonly", "yes", "--appendfsync", appendfsync],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client, deadline = redis.Redis(host="127.0.0.1", port=port), time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.02)
    client.close()
    return proc, f"redis://127.0.0.1:{port}/0"


def start_state_process(url: str) -> tuple[subprocess.Popen, str]:
    """`--serve URL` in a child process; it prints its port when serving."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve", url], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise SystemExit(f"state server did not start: {line!r}")
    return proc, f"127.0.0.1:{line}"


async def serve(url: str) -> None:
    from services.state.deployment import start_state_server

    server, port = await start_state_server(url, "127.0.0.1", 0)
    print(port, flush=True)
    await server.wait_for_termination()


# ---- measurements -------------------------------------------------------------------------------

async def timed(samples: list[float], call) -> None:
    t0 = time.perf_counter()
    await call
    samples.append(time.perf_counter() - t0)


async def measure_store(client: StateClient, ops: int, turns: int) -> dict[str, dict[str, float]]:
    """Writes and reads of one snapshot of a `turns`-turn conversation, one at a time."""
    for i in range(min(200, ops)):  # warm up: channel, connections, code paths
        await client.put_response(snapshot(f"warm{i}", turns))
        await client.get_response(IDENTITY, f"warm{i}")
    writes: list[float] = []
    reads: list[float] = []
    for i in range(ops):
        await timed(writes, client.put_response(snapshot(f"r{i}", turns)))
    for i in range(ops):
        await timed(reads, client.get_response(IDENTITY, f"r{i}"))
    return {"write": stats(writes), "read": stats(reads)}


async def measure_chain_state(client: StateClient, turns: int, chains: int) -> dict[str, dict[str, float]]:
    """The state service's part of previous_response_id resolution, per turn of `turns`-turn chains:
    read the parent's snapshot (resolve), then store the child's (one more exchange)."""
    resolves: list[float] = []
    stores: list[float] = []
    for c in range(chains):
        parent = ""
        for turn in range(1, turns + 1):
            rid = f"chain{c}-{turn}"
            if parent:
                await timed(resolves, client.get_response(IDENTITY, parent))
            await timed(stores, client.put_response(snapshot(rid, turn, parent)))
            parent = rid
    return {"chain_resolve": stats(resolves), "chain_store": stats(stores)}


CHAIN_MODELS = """\
models:
  - name: chat
    model: builtin:tiny-qwen2
    max_model_len: 2048
    max_num_seqs: 4
    engine_args: {enable_prefix_caching: false}
"""


async def streamed_turn(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """One streamed POST /v1/responses: (seconds to the first output_text delta, final response)."""
    t0 = time.perf_counter()
    ttft, final = float("nan"), None
    async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise SystemExit(f"POST /v1/responses -> {r.status_code}: {(await r.aread()).decode()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta" and ttft != ttft:
                ttft = time.perf_counter() - t0
            elif event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = event["response"]
    if final is None or final["status"] == "failed" or ttft != ttft:
        raise SystemExit(f"turn did not complete with text: {final}")
    return ttft, final


async def measure_chain_ttft(gateway_url: str, turns: int, chains: int) -> dict[str, dict[str, float]]:
    """Added TTFT of previous_response_id resolution on `turns`-turn chains, end to end: per turn, the
    TTFT continuing with previous_response_id minus the TTFT of the same conversation sent whole
    (store: false), the two sent back to back in alternating order."""
    prompts = list(corpus.FIXED_ANSWERS)
    by_id: list[float] = []
    inline: list[float] = []
    added: tuple[list[float], list[float]] = ([], [])  # by order: chained request sent first / second
    async with httpx.AsyncClient(base_url=gateway_url, timeout=120) as http:
        for c in range(-1, chains):  # chain -1 warms up and is not counted
            parent: str | None = None
            conversation: list[dict[str, Any]] = []
            for turn in range(turns):
                user = {"type": "message", "role": "user", "content": prompts[(c + turn) % len(prompts)]}
                chained = {"model": "chat", "input": [user], "previous_response_id": parent, "store": True,
                           "max_output_tokens": 64, "temperature": 0}
                whole = {"model": "chat", "input": [*conversation, user], "store": False,
                         "max_output_tokens": 64, "temperature": 0}
                if turn % 2:
                    t_inline, same = await streamed_turn(http, whole)
                    t_chain, final = await streamed_turn(http, chained)
                else:
                    t_chain, final = await streamed_turn(http, chained)
                    t_inline, same = await streamed_turn(http, whole)
                if same["usage"]["input_tokens"] != final["usage"]["input_tokens"]:  # else it compares prefills
                    raise SystemExit(f"turn {turn}: the two paths built different prompts: "
                                     f"{same['usage']['input_tokens']} vs {final['usage']['input_tokens']} tokens")
                parent = final["id"]
                conversation += [user, *final["output"]]
                if c >= 0 and turn > 0:  # turn 0 has nothing to resolve
                    by_id.append(t_chain)
                    inline.append(t_inline)
                    added[turn % 2].append(t_chain - t_inline)
    # AB/BA crossover: whichever request of a pair goes first pays for a colder path, so the
    # difference is taken per order and the two medians averaged, which cancels the order effect.
    first, second = stats(added[0]), stats(added[1])
    both = {"n": first["n"] + second["n"], "p50_ms": (first["p50_ms"] + second["p50_ms"]) / 2,
            "p99_ms": max(first["p99_ms"], second["p99_ms"])}
    return {"ttft_previous_id": stats(by_id), "ttft_inline": stats(inline), "ttft_added_chain_first": first,
            "ttft_added_chain_second": second, "ttft_added": both}


def bench_chain_ttft(redis_url: str, args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, float]]:
    config = workdir / "models.yaml"
    config.write_text(CHAIN_MODELS)
    platform = PlatformProcess.start(config, workdir / "mship.log", gateway_replicas=1, state_store=redis_url)
    try:
        platform.wait_ready()
        return asyncio.run(measure_chain_ttft(platform.base_url, args.turns, args.e2e_chains))
    finally:
        platform.stop()


async def bench_backend(url: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    proc, address = start_state_process(url)
    client = StateClient(address)
    try:
        results = await measure_store(client, args.ops, args.turns)
        results.update(await measure_chain_state(client, args.turns, args.chains))
        return results
    finally:
        await client.close()
        stop_processes([proc], grace_s=10)


LABELS = {"write": "store write (PutResponse)", "read": "store read (GetResponse)",
          "chain_resolve": "chain: resolve parent / turn", "chain_store": "chain: store child / turn",
          "ttft_previous_id": "e2e TTFT, previous_response_id", "ttft_inline": "e2e TTFT, whole input inline",
          "ttft_added_chain_first": "e2e added, chained sent 1st", "ttft_added_chain_second":
          "e2e added, chained sent 2nd", "ttft_added": "e2e TTFT added by resolution"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=2000, help="writes and reads per backend")
    p.add_argument("--turns", type=int, default=20, help="conversation length (exchanges)")
    p.add_argument("--chains", type=int, default=20, help="chains of --turns turns")
    p.add_argument("--e2e-chains", type=int, default=5, help="end-to-end chains through the gateway (0: skip)")
    p.add_argument("--backends", default="memory,redis")
    p.add_argument("--appendfsync", default="everysec", choices=["always", "everysec", "no"])
    p.add_argument("--json", type=Path)
    p.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the state server process
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    table: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mship-bench-") as tmp:
        for backend in args.backends.split(","):
            redis_proc = None
            if backend == "redis":
                redis_proc, url = start_redis(Path(tmp), args.appendfsync)
            else:
                url = "memory://"
            try:
                table[backend] = asyncio.run(bench_backend(url, args))
                if backend == "redis" and args.e2e_chains:
                    table["gateway"] = bench_chain_ttft(url, args, Path(tmp))
            finally:
                if redis_proc is not None:
                    stop_processes([redis_proc], grace_s=10)
    size = len(snapshot("x", args.turns).SerializeToString())
    print(f"snapshot {size / 1024:.1f} KB ({args.turns} turns); one call in flight; Redis AOF "
          f"appendfsync={args.appendfsync}; load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'backend':<8} {'operation':<30} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for backend, rows in table.items():
        for op, r in rows.items():
            print(f"{backend:<8} {LABELS[op]:<30} {r['n']:>6} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}")
    if "gateway" in table:
        print("target: e2e TTFT added by resolution <= 1 ms p50 per turn (Redis on loopback)")
    if args.json:
        write_json(args.json, args, table=table, snapshot_bytes=size)


if __name__ == "__main__":
    unwind_on_signals()
    main()
