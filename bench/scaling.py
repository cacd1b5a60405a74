"""What autoscaling buys and how fast it reacts: a real platform (`mship start`, builtin:tiny-qwen2
on vLLM as `scale`), clients hammering the gateway.

1. `num_replicas: 1`, steady load: requests/s at one replica.
2. The same model redeployed with `autoscaling_config: {min_replicas: 1, max_replicas: 2,
   target_ongoing_requests: T}`; load starts: the time from load start to the second replica
   registered and to it serving (its engine has generated tokens), then requests/s at two replicas.

  .venv/bin/python bench/scaling.py [--clients 6] [--steady-s 30] [--max-tokens 32] [--json out.json]

On a 2-core box both replicas share the same cores, so the second one adds little throughput; the
time to the second replica (mostly its engine load) is what this measures best here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

import grpc  # noqa: E402

from bench.report import pct, unwind_on_signals, write_json  # noqa: E402
from mship.worker.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
from tests.load_generator import LoadGenerator  # noqa: E402
from tests.platform_process import PlatformProcess, mship  # noqa: E402

MODEL = "scale"
BASE = f"models:\n  - name: {MODEL}\n    model: builtin:tiny-qwen2\n    max_model_len: 512\n    max_num_seqs: 8\n" \
       "    num_cpus: 0.5\n"


def generated(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=10) \
            .generated_tokens_total


def wait(check, what: str, timeout_s: float = 600) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.1)
    return time.monotonic()


def steady(load: LoadGenerator, seconds: float) -> dict[str, float]:
    t0, n0 = time.monotonic(), load.ok
    time.sleep(seconds)
    lat = load.latencies(t0)
    return {"rps": (load.ok - n0) / (time.monotonic() - t0), "p50_ms": 1000 * pct(lat, 50),
            "p99_ms": 1000 * pct(lat, 99)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--steady-s", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--target", type=float, default=2.0, help="target_ongoing_requests of the autoscaled model")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mship-scaling-bench-"))
    fixed, auto = tmp / "fixed.yaml", tmp / "auto.yaml"
    fixed.write_text(BASE + "    num_replicas: 1\n")
    auto.write_text(BASE + f"    autoscaling_config: {{min_replicas: 1, max_replicas: 2, target_ongoing_requests: "
                           f"{args.target}, upscale_delay_s: 0, downscale_delay_s: 30}}\n")
    platform = PlatformProcess.start(fixed, tmp / "mship.log", gateway_replicas=1)
    result: dict[str, float] = {}
    try:
        platform.wait_ready()
        with LoadGenerator(platform.base_url, MODEL, clients=args.clients, max_tokens=args.max_tokens) as load:
            load.wait_for(10)  # warm
            one = steady(load, args.steady_s)
        out = mship("--coordinator", platform.coordinator, "deploy", "--config", str(auto), "--wait")
        if out.returncode != 0:
            raise SystemExit(out.stdout + out.stderr)
        # The autoscaling config restarts the replica (Serve's rolling update): start once it settled.
        wait(lambda: [(a.status, a.running_replicas, a.target_replicas) for a in platform.models().apps] ==
             [("RUNNING", 1, 1)] and len(platform.replicas(MODEL)) == 1, "the autoscaled deployment settled")
        (first,) = platform.replicas(MODEL)
        with LoadGenerator(platform.base_url, MODEL, clients=args.clients, max_tokens=args.max_tokens) as load:
            t0 = time.monotonic()
            registered = wait(lambda: len(platform.replicas(MODEL)) == 2, "a second replica")
            (new,) = [r for r in platform.replicas(MODEL) if r.replica_id != first.replica_id]
            address = f"{new.endpoint.host}:{new.endpoint.port}"
            warm = generated(address)
            serving = wait(lambda: generated(address) > warm, "the second replica serving")
            two = steady(load, args.steady_s)
            failures = list(load.failures)
        result = {"to_registered_s": registered - t0, "to_serving_s": serving - t0,
                  "engine_load_s": new.engine_load_s, "rps_1": one["rps"], "rps_2": two["rps"],
                  "p50_ms_1": one["p50_ms"], "p99_ms_1": one["p99_ms"], "p50_ms_2": two["p50_ms"],
                  "p99_ms_2": two["p99_ms"]}
    finally:
        platform.stop()
    print(f"{args.clients} clients ({args.max_tokens} tokens, alternating streamed / non-streamed); load avg "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; failed requests during the scale-up: {len(failures)}")
    print(f"load start -> second replica registered {result['to_registered_s']:.1f} s, serving "
          f"{result['to_serving_s']:.1f} s (its engine load {result['engine_load_s']:.1f} s)")
    print(f"{'replicas':>8} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for n in (1, 2):
        print(f"{n:>8} {result[f'rps_{n}']:>7.1f} {result[f'p50_ms_{n}']:>8.0f} {result[f'p99_ms_{n}']:>8.0f}")
    for f in failures[:5]:
        print(f"failure: {f}")
    if args.json:
        write_json(args.json, args, result=result, failures=failures)


if __name__ == "__main__":
    unwind_on_signals()
    main()
