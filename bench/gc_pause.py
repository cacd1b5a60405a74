"""What an oldest-generation garbage collection costs a token-path process, before and after its
start-up heap is frozen (services/common/gc_heap.py): one run, each role in a fresh process.

  gateway  the gateway's imports and app (Ray, grpc, FastAPI, the endpoints)
  worker   a worker with builtin:tiny-qwen2 loaded on vLLM and warmed (torch, transformers, vLLM)

Such a collection stops the process's event loop: for a stream it is one gap between two tokens.
Prints objects the collector tracks and the full-collection pause (median and max of --repeats);
--json PATH writes them.

  .venv/bin/python bench/gc_pause.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

ROLES = ("gateway", "worker")


def full_collections(repeats: int) -> list[float]:
    pauses = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gc.collect()
        pauses.append(1000 * (time.perf_counter() - t0))
    return pauses


async def build_heap(role: str) -> object:
    """What a replica of `role` holds once it serves (returned so that it stays alive)."""
    import ray  # noqa: F401  (a replica is a Ray worker process: its heap too)

    if role == "gateway":
        from services.common.picker import make_picker
        from services.common.routes import RouteTable
        from services.gateway.app import GatewaySettings, create_app

        return create_app(RouteTable(make_picker("prefix_affinity")), GatewaySettings(coordinator="127.0.0.1:1"))
    from mship.common.v1 import common_pb2
    from services.worker.builtin import resolve_model_ref
    from services.worker.engine import RenderRequest
    from services.worker.host import start_engine
    from services.worker.sampling import Sampling
    from services.worker.vllm_engine import set_engine_env

    set_engine_env()
    spec = common_pb2.ModelSpec(name="tiny", model="builtin:tiny-qwen2", max_model_len=512, max_num_seqs=4)
    engine = await start_engine(spec, resolve_model_ref(spec.model))
    prompt = await engine.render(RenderRequest(prompt="warm up"))
    async for _ in engine.generate(prompt, Sampling(max_tokens=8, temperature=0.0), "warm"):
        pass
    return engine


def measure(role: str, repeats: int) -> dict[str, float]:
    from services.common.gc_heap import freeze_startup_heap

    loop = asyncio.new_event_loop()
    held = loop.run_until_complete(build_heap(role))
    tracked = len(gc.get_objects())
    before = full_collections(repeats)
    frozen = freeze_startup_heap(role)
    after = full_collections(repeats)
    del held
    return {"tracked_objects": tracked, "frozen_objects": frozen,
            "pause_ms_p50_before": statistics.median(before), "pause_ms_max_before": max(before),
            "pause_ms_p50_after": statistics.median(after), "pause_ms_max_after": max(after)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    p.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)  # one role, in this process
    args = p.parse_args()
    if args.role:
        print(json.dumps(measure(args.role, args.repeats)), flush=True)
        import psutil

        for child in psutil.Process().children(recursive=True):  # the engine's processes, started here
            child.kill()
        os._exit(0)  # no slow teardown to wait for
    rows = {}
    for role in ROLES:
        done = subprocess.run([sys.executable, __file__, "--role", role, "--repeats", str(args.repeats)],
                              capture_output=True, text=True, check=True)
        rows[role] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'role':<8} {'tracked':>10} {'frozen':>10} {'full GC p50 ms':>15} {'max':>8} {'frozen: p50 ms':>15} "
          f"{'max':>8}")
    for role, r in rows.items():
        print(f"{role:<8} {r['tracked_objects']:>10} {r['frozen_objects']:>10} {r['pause_ms_p50_before']:>15.1f} "
              f"{r['pause_ms_max_before']:>8.1f} {r['pause_ms_p50_after']:>15.2f} {r['pause_ms_max_after']:>8.2f}")
    if args.json:
        from bench.report import write_json

        write_json(args.json, args, table=rows)


if __name__ == "__main__":
    main()
