"""What the edge costs: the same model and engine settings, one run, three paths, interleaved:

  gateway    OpenAI HTTP/SSE -> mship gateway (Serve replica) -> gRPC -> worker replica -> vLLM
  vllm-http  vLLM's own OpenAI server (python -m vllm.entrypoints.openai.api_server)
  grpc       mship's Python client -> worker replica (the internal low-latency path)
  floor      with --floor: bench/edge_floor.py -> gRPC -> the same worker replica; an edge that does
             nothing but carry tokens (one Infer stream per request, as the gateway): what any
             separate edge process keeps of vLLM's throughput under the platform's contract
  vllm-again with --aa: vLLM's server once more, as a path of its own: how far the measure moves
             between two paths that are the same (the noise the shares must be read against)

Prints TTFT p50/p99, inter-token latency p50, throughput, and the server-side CPU each path spends
per generated token (its own processes, engine included; the gateway's replica also on its own) at
1, 8 and 32 concurrent streams, and the part of it its front end spends (the processes between the
engine and the client: vLLM's API server; the worker replica; the worker and gateway replicas);
--json PATH writes them. Both stacks' engines run with the
platform's engine settings (`set_engine_env`: threads, KV cache, the busy-wait bound of
bench/engine_spin.py), so what differs is the edge; each path starts once the box is back to idle.
On a small box the client, the servers and the engine share the cores, so throughput there is CPU
per token: the CPU columns say where it goes.
Targets (issue 3): the gateway adds <= 1 ms p50 / <= 3 ms p99 TTFT over
vLLM's server and keeps >= 99% of its throughput; the gRPC client adds <= 0.3 ms p50.
First it prints what API keys and rate limits add at the edge (bench/admission_overhead.py;
issue 19: <= 0.2 ms p50 in memory, <= 1 ms with Redis); `--admission-only` stops there.

`--model` picks the builtin both stacks serve (default tiny-qwen2, whose tiny steps make the edge's
share of the CPU per token the largest it can be; smollm2-135m-instruct is a real model).

  .venv/bin/python bench/edge_overhead.py [--model builtin:tiny-qwen2] [--rounds 3] [--tokens 64]
                                          [--floor] [--aa] [--json out.json] [--admission-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.report import pct, stop_processes, unwind_on_signals, write_json  # noqa: E402
from clients.client import MshipClient  # noqa: E402
from services.worker.builtin import resolve_model_ref  # noqa: E402
from services.worker.vllm_engine import DEFAULT_CPU_KV_CACHE_BYTES, set_engine_env  # noqa: E402
from tests.platform_process import PlatformProcess, free_port  # noqa: E402

MODEL, MAX_NUM_SEQS, MAX_MODEL_LEN = "tiny", 32, 1024  # MODEL: the name both stacks serve it under
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
# An idle connection is not reused after 2 s: the servers (uvicorn) close theirs after 5, and a
# quiet wait between batches can take longer; reusing one as the server closes it fails the request.
CLIENT_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0)
# which CPU meter holds each path's server stack
# (mux: bench/mux_vllm.py's multiplexed path, measured with this module's client and meters)
STACK = {"vllm-http": "vllm-server", "vllm-again": "vllm-server", "gateway": "platform-path",
         "grpc": "worker-replica", "floor": "floor-path", "mux": "mux-path"}
EDGE = {"gateway": "gateway-replica", "floor": "floor-edge", "mux": "mux-edge"}  # a path's separate edge
# ...and the meters of its front end: the engine's processes are the same on every path
FRONT_END = {"vllm-http": ("vllm-api-server",), "vllm-again": ("vllm-api-server",),
             "gateway": ("worker-front-end", "gateway-replica"), "grpc": ("worker-front-end",),
             "floor": ("worker-front-end", "floor-edge"), "mux": ("worker-front-end", "mux-edge")}


async def sse_stream(http: httpx.AsyncClient, tokens: int) -> tuple[float, list[float], int]:
    """One streamed chat over HTTP: (ttft, gaps between content chunks, completion tokens)."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps: list[float] = []
    generated = 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                stamps.append(time.perf_counter())
            elif line.startswith("data: {") and '"completion_tokens"' in line:
                generated = json.loads(line[6:])["usage"]["completion_tokens"]
    return stamps[0] - t0, [b - a for a, b in itertools.pairwise(stamps)], generated


async def grpc_stream(client: MshipClient, tokens: int) -> tuple[float, list[float], int]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    generated = 0
    async for event in client.stream_chat(MODEL, MESSAGES, max_tokens=tokens, ignore_eos=True, temperature=0.0):
        if event.HasField("delta") and event.delta.text:
            stamps.append(time.perf_counter())
        elif event.HasField("final"):
            generated = event.final.usage.completion_tokens
    return stamps[0] - t0, [b - a for a, b in itertools.pairwise(stamps)], generated


class CpuMeter:
    """CPU seconds (user + system) spent by a set of processes and (unless `children` is False)
    their children."""

    def __init__(self, roots: list[psutil.Process], children: bool = True) -> None:
        # by pid: a root may be another's descendant (vLLM's model worker is EngineCore's child)
        self.procs = list({q.pid: q for p in roots
                           for q in (p, *(p.children(recursive=True) if children else ()))}.values())

    def seconds(self) -> float:
        total = 0.0
        for proc in self.procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total


class Quiet:
    """Waits until the box is back to its idle CPU use: an engine that served the path before spins
    for up to its MSHIP_ENGINE_SPIN_S after its last step (vLLM's own: 1 s), and the next path
    would pay for that, not for its own work. The idle level is measured once, with everything up."""

    WINDOW_S = 0.2

    def __init__(self, samples: int = 10) -> None:
        self.idle = statistics.median(psutil.cpu_percent(interval=self.WINDOW_S) for _ in range(samples))

    def wait(self, margin: float = 10.0, timeout_s: float = 3.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and psutil.cpu_percent(interval=self.WINDOW_S) > self.idle + margin:
            pass


async def measure(paths: dict, meters: dict[str, CpuMeter], concurrency: int, rounds: int,
                  tokens: int, quiet: Quiet) -> dict[str, dict[str, float]]:
    samples = {name: {"ttft": [], "itl": [], "rate": [], "tokens": 0, "cpu": {k: 0.0 for k in meters}}
               for name in paths}
    for _ in range(rounds):
        for name, one in paths.items():  # interleaved: drift on the box hits every path alike
            quiet.wait()
            # An unmeasured batch first: a path that sat idle while the others ran pays for waking
            # its processes (engine busy-loop back-off, scheduler), which is not what the edge costs.
            await asyncio.gather(*[one(8) for _ in range(concurrency)])
            cpu0 = {k: m.seconds() for k, m in meters.items()}
            t0 = time.perf_counter()
            results = await asyncio.gather(*[one(tokens) for _ in range(concurrency)])
            wall = time.perf_counter() - t0
            s = samples[name]
            for k, m in meters.items():
                s["cpu"][k] += m.seconds() - cpu0[k]
            s["ttft"] += [r[0] * 1000 for r in results]
            s["itl"] += [g * 1000 for r in results for g in r[1]]
            s["rate"].append(sum(r[2] for r in results) / wall)
            s["tokens"] += sum(r[2] for r in results)
    out = {}
    for name, s in samples.items():
        row = {"ttft_p50_ms": statistics.median(s["ttft"]), "ttft_p99_ms": pct(s["ttft"], 99),
               "itl_p50_ms": statistics.median(s["itl"]), "tok_s": statistics.median(s["rate"]),
               "round_tok_s": s["rate"]}
        # µs of server CPU per generated token: the path's own stack, and a separate edge alone
        row["server_cpu_us_per_token"] = 1e6 * s["cpu"][STACK[name]] / s["tokens"]
        row["front_end_cpu_us_per_token"] = 1e6 * sum(s["cpu"][k] for k in FRONT_END[name]) / s["tokens"]
        if name in EDGE:
            row["edge_cpu_us_per_token"] = 1e6 * s["cpu"][EDGE[name]] / s["tokens"]
        out[name] = row
    return out


def throughput_ratio(path: dict, base: dict) -> float:
    """A path's throughput as a share of the base's: the median over rounds of the two rates measured
    next to each other in the same round. A ratio of medians lets the box's drift between rounds
    (10–30 points here, vLLM's server against itself) into the share; pairing within a round leaves most of it out."""
    return statistics.median(a / b for a, b in zip(path["round_tok_s"], base["round_tok_s"], strict=True))


def start_server(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    # In this (the bench's) session: with sched_autogroup each session is its own scheduling group,
    # and a lightly loaded client session waits 100+ ms for a CPU next to a busy server session.
    # At the niceness Ray gives the platform's processes (15 unless RAY_worker_niceness says
    # otherwise): the client (nice 0) must not out-prioritise one server stack and not the other.
    niceness = int(os.environ.get("RAY_worker_niceness", "15"))
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            preexec_fn=lambda: os.nice(niceness))


def start_vllm_server(model_dir: str, port: int, log: Path) -> subprocess.Popen:
    set_engine_env()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--max-model-len",
           str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS), "--enforce-eager", "--enable-prefix-caching",
           "--seed", "0", "--kv-cache-memory-bytes", str(DEFAULT_CPU_KV_CACHE_BYTES)]
    return start_server(cmd, log)


def first_line(proc: subprocess.Popen, log: Path, prefix: str, timeout_s: float = 60) -> str:
    """The first line of a server's log starting with `prefix` (where it says it listens)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if line := next((ln for ln in log.read_text().splitlines() if ln.startswith(prefix)), None):
            return line
        time.sleep(0.1)
    raise RuntimeError(f"{proc.args} did not start: {log.read_text()[-2000:]}")


def start_floor(platform: PlatformProcess, log: Path) -> tuple[subprocess.Popen, str]:
    """bench/edge_floor.py in front of the platform's worker replica, with a gateway replica's
    environment; returns it and its URL."""
    from services.launcher import gateway_env

    endpoint = platform.replicas(MODEL)[0].endpoint
    floor = start_server([sys.executable, str(ROOT / "bench" / "edge_floor.py"), f"{endpoint.host}:{endpoint.port}"],
                         log, gateway_env())
    return floor, first_line(floor, log, "http")


def wait_http(url: str, server: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {server.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(url)


def cpu_meters(platform: PlatformProcess, server: subprocess.Popen,
               floor: subprocess.Popen | None) -> dict[str, CpuMeter]:
    gateway, worker = platform.find("ServeReplica:mship-gateway"), platform.find(f"ServeReplica:mship-model-{MODEL}")
    api_server = psutil.Process(server.pid)
    floor_edge = [psutil.Process(floor.pid)] if floor else []
    return {"floor-edge": CpuMeter(floor_edge), "floor-path": CpuMeter(worker + floor_edge),
            "vllm-server": CpuMeter([api_server]), "gateway-replica": CpuMeter(gateway),
            "worker-replica": CpuMeter(worker), "platform-path": CpuMeter(gateway + worker),
            "vllm-api-server": CpuMeter([api_server], children=False),
            "worker-front-end": CpuMeter(worker, children=False)}


async def run(args: argparse.Namespace, platform: PlatformProcess, vllm_port: int, floor_url: str | None,
              meters: dict[str, CpuMeter]) -> dict:
    urls = {"vllm-http": f"http://127.0.0.1:{vllm_port}", "gateway": platform.base_url, "floor": floor_url,
            "vllm-again": f"http://127.0.0.1:{vllm_port}" if args.aa else None}
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(MshipClient(platform.coordinator))
        paths = {name: functools.partial(sse_stream, await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, timeout=120, limits=CLIENT_LIMITS))) for name, url in urls.items() if url}
        paths["grpc"] = functools.partial(grpc_stream, client)
        quiet = Quiet()  # before any traffic: every engine has been idle since it started
        await measure(paths, meters, 4, 5, 16, quiet)  # warm up connections and the engines
        # At least ~30 TTFT samples per path at every concurrency: a p50 of 3 says nothing.
        return {str(c): await measure(paths, meters, c, max(args.rounds, -(-30 // c)), args.tokens, quiet)
                for c in (1, 8, 32)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-qwen2", help="the builtin both stacks serve")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--floor", action="store_true",
                   help="also bench/edge_floor.py (an edge that only carries tokens) in front of the same worker")
    p.add_argument("--aa", action="store_true",
                   help="also vLLM's server a second time, as a path of its own (the measure's own noise)")
    p.add_argument("--json", type=Path)
    p.add_argument("--admission-only", action="store_true",
                   help="only what API keys and rate limits add (bench/admission_overhead.py), no vLLM")
    args = p.parse_args()
    from bench import admission_overhead

    admission = asyncio.run(admission_overhead.main_async(argparse.Namespace(requests=300, rounds=3)))
    if args.admission_only:
        if args.json:
            write_json(args.json, args, admission=admission)
        return
    model_dir = resolve_model_ref(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="mship-edge-bench-"))
    (tmp / "models.yaml").write_text(f"models:\n  - name: {MODEL}\n    model: {args.model}\n"
                                     f"    max_model_len: {MAX_MODEL_LEN}\n    max_num_seqs: {MAX_NUM_SEQS}\n")
    platform = PlatformProcess.start(tmp / "models.yaml", tmp / "mship.log", gateway_replicas=1)
    vllm_port = free_port()
    server = start_vllm_server(model_dir, vllm_port, tmp / "vllm.log")
    floor = floor_url = None
    try:
        platform.wait_ready()
        wait_http(f"http://127.0.0.1:{vllm_port}/health", server)
        if args.floor:
            floor, floor_url = start_floor(platform, tmp / "floor.log")
        table = asyncio.run(run(args, platform, vllm_port, floor_url, cpu_meters(platform, server, floor)))
    finally:
        try:
            stop_processes([server, floor])
        finally:
            platform.stop()
    print(f"{'streams':>7} {'path':<10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'ITL p50 ms':>11} {'tok/s':>9} "
          f"{'server CPU us/tok':>18} {'front end us/tok':>17}")
    summary = {}
    for c, rows in table.items():
        for name, r in rows.items():
            print(f"{c:>7} {name:<10} {r['ttft_p50_ms']:>12.2f} {r['ttft_p99_ms']:>12.2f} {r['itl_p50_ms']:>11.2f} "
                  f"{r['tok_s']:>9.0f} {r['server_cpu_us_per_token']:>18.0f} {r['front_end_cpu_us_per_token']:>17.0f}")
        base, grpc_ = rows["vllm-http"], rows["grpc"]
        summary[c] = {"grpc_ttft_p50_vs_vllm_http_ms": grpc_["ttft_p50_ms"] - base["ttft_p50_ms"]}
        if "vllm-again" in rows:
            summary[c]["vllm_again_throughput_ratio"] = throughput_ratio(rows["vllm-again"], base)
            print(f"{c:>7} vllm-again vs vLLM server (the same server): throughput "
                  f"{100 * summary[c]['vllm_again_throughput_ratio']:.1f}%")
        for name in (n for n in EDGE if n in rows):
            edge = rows[name]
            summary[c] |= {f"{name}_ttft_p50_added_ms": edge["ttft_p50_ms"] - base["ttft_p50_ms"],
                           f"{name}_ttft_p99_added_ms": edge["ttft_p99_ms"] - base["ttft_p99_ms"],
                           f"{name}_throughput_ratio": throughput_ratio(edge, base),
                           f"{name}_edge_cpu_us_per_token": edge["edge_cpu_us_per_token"]}
            print(f"{c:>7} {name} vs vLLM server: TTFT p50 {summary[c][f'{name}_ttft_p50_added_ms']:+.2f} ms, "
                  f"p99 {summary[c][f'{name}_ttft_p99_added_ms']:+.2f} ms, throughput "
                  f"{100 * summary[c][f'{name}_throughput_ratio']:.1f}%; its edge spends "
                  f"{edge['edge_cpu_us_per_token']:.0f} us CPU per token")
    if args.json:
        write_json(args.json, args, table=table, summary=summary, admission=admission)


if __name__ == "__main__":
    unwind_on_signals()
    main()
