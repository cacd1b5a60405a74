"""What a blue-green cutover costs: a real platform (`mship start`, builtin:tiny-qwen2 as `swap`),
clients hammering the gateway throughout, and a config change that makes a new version.

For each cutover it prints the time from the deploy request to the new version serving (the
coordinator's READY event, i.e. the route switch), split into the engine load (the new replica's
own lease-granted -> warm time) and the platform's overhead (the rest: Serve scheduling, process
start, registration, routing), and the p50/p99 latency of the hammering clients during the cutover
vs the steady state before it. Targets (issue 5): platform overhead <= 2 s beyond the engine load;
p99 during the cutover <= 1.5x steady state.

  .venv/bin/python bench/cutover.py [--rounds 2] [--clients 4] [--steady-s 20] [--json out.json]
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
from clients.modelset import load_model_set  # noqa: E402
from mship.coordinator.v1 import coordinator_pb2 as pb  # noqa: E402
from mship.coordinator.v1 import coordinator_pb2_grpc  # noqa: E402
from tests.load_generator import LoadGenerator  # noqa: E402
from tests.platform_process import PlatformProcess  # noqa: E402

MODEL = "swap"


def models_yaml(max_model_len: int) -> str:
    return (f"models:\n  - name: {MODEL}\n    model: builtin:tiny-qwen2\n    max_model_len: {max_model_len}\n"
            "    max_num_seqs: 8\n    num_cpus: 0.5\n")


def cutover(platform: PlatformProcess, config: Path) -> dict[str, float]:
    """Deploy `config` and follow it: seconds to READY (route switched) and to the deploy's end."""
    request = pb.DeployRequest(models=load_model_set(str(config)), mode=pb.DEPLOY_MODE_ADDITIVE)
    t0 = time.monotonic()
    ready = done = float("nan")
    with grpc.insecure_channel(platform.coordinator) as channel:
        for event in coordinator_pb2_grpc.CoordinatorStub(channel).Deploy(request):
            if event.HasField("model") and event.model.phase == pb.MODEL_PHASE_READY:
                ready = time.monotonic() - t0
            if event.state == pb.DEPLOY_STATE_FAILED:
                raise SystemExit(f"the deploy failed: {event.message}")
            if event.state == pb.DEPLOY_STATE_SUCCEEDED:
                done = time.monotonic() - t0
    engine_load = max(r.engine_load_s for r in platform.replicas(MODEL))
    return {"t0": t0, "to_serving_s": ready, "engine_load_s": engine_load, "platform_overhead_s": ready - engine_load,
            "to_done_s": done}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="cutovers (alternating between two versions)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--steady-s", type=float, default=20.0, help="steady-state window before each cutover")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mship-cutover-bench-"))
    configs = []
    for i, max_model_len in enumerate((512, 768)):
        configs.append(tmp / f"v{i}.yaml")
        configs[-1].write_text(models_yaml(max_model_len))
    platform = PlatformProcess.start(configs[0], tmp / "mship.log", gateway_replicas=1)
    rows = []
    try:
        platform.wait_ready()
        with LoadGenerator(platform.base_url, MODEL, clients=args.clients) as load:
            load.wait_for(20)  # warm
            for r in range(args.rounds):
                steady_from = time.monotonic()
                time.sleep(args.steady_s)  # the steady-state window: load only
                result = cutover(platform, configs[(r + 1) % 2])
                steady = load.latencies(steady_from, result["t0"])
                during = load.latencies(result["t0"], result["t0"] + result["to_done_s"])
                result.update({"steady_p50_ms": 1000 * pct(steady, 50), "steady_p99_ms": 1000 * pct(steady, 99),
                               "cutover_p50_ms": 1000 * pct(during, 50), "cutover_p99_ms": 1000 * pct(during, 99),
                               "requests_steady": len(steady), "requests_cutover": len(during)})
                result["p99_ratio"] = result["cutover_p99_ms"] / result["steady_p99_ms"]
                del result["t0"]
                rows.append(result)
            failures = list(load.failures)
    finally:
        platform.stop()
    print(f"{args.clients} clients (alternating streamed / non-streamed, 8 tokens); load avg "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; failed requests: {len(failures)}")
    print(f"{'round':>5} {'to serving s':>12} {'engine s':>9} {'platform s':>10} {'to done s':>9} "
          f"{'steady p50/p99 ms':>18} {'cutover p50/p99 ms':>19} {'p99 x':>6}")
    for i, r in enumerate(rows):
        print(f"{i:>5} {r['to_serving_s']:>12.2f} {r['engine_load_s']:>9.2f} {r['platform_overhead_s']:>10.2f} "
              f"{r['to_done_s']:>9.2f} {r['steady_p50_ms']:>8.1f} / {r['steady_p99_ms']:>7.1f} "
              f"{r['cutover_p50_ms']:>8.1f} / {r['cutover_p99_ms']:>7.1f} {r['p99_ratio']:>6.2f}")
    print("targets: platform overhead <= 2 s beyond the engine load; cutover p99 <= 1.5x steady")
    for f in failures[:5]:
        print(f"failure: {f}")
    if args.json:
        write_json(args.json, args, rounds=rows, failures=failures)


if __name__ == "__main__":
    unwind_on_signals()
    main()
