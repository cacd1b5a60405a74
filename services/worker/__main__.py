"""Serve one model on its own gRPC server (for tests and for operators debugging an engine).

python -m services.worker --model builtin:tiny-qwen2 --port 50061 [--name NAME] [--loader vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from mship.common.v1 import common_pb2
from services.common.logs import configure_logging
from services.common.tracing import configure_tracing
from services.common.vocabulary import LOADER_USECASES, LOADERS, USECASES
from services.worker.server import start_worker_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.worker", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="builtin:NAME, a Hugging Face id or a local path")
    p.add_argument("--name", help="served model name (default: the reference)")
    p.add_argument("--loader", choices=sorted(LOADERS), default="vllm")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = an ephemeral port (printed)")
    p.add_argument("--max-model-len", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=0)
    p.add_argument("--num-cpus", type=float, default=0.0, help="the CPU share (llama_cpp: its threads)")
    p.add_argument("--embed", action="store_true", help="serve embeddings instead of generation")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    usecase = common_pb2.USECASE_EMBED if args.embed else common_pb2.USECASE_GENERATE
    if args.loader in LOADER_USECASES:  # the audio loaders serve one usecase each
        usecase = USECASES[LOADER_USECASES[args.loader]]
    spec = common_pb2.ModelSpec(
        name=args.name or args.model, model=args.model, loader=LOADERS[args.loader], usecase=usecase,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, num_cpus=args.num_cpus)
    worker = await start_worker_server(spec, args.host, args.port)
    print(f"worker listening on {args.host}:{worker.port} (model {spec.name})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)  # the engine's processes must not be orphaned
    await stop.wait()
    await worker.stop()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    configure_logging("worker")
    configure_tracing("worker")
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
