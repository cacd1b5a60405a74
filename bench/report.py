"""What every bench shares: percentiles, the JSON file it writes with its run's context, and a stop
that leaves nothing it started running."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); NaN for no values."""
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))] if values else float("nan")


def write_json(path: Path, args: argparse.Namespace, **results: Any) -> None:
    """`results` plus the arguments, CPU count and load average the numbers were taken with."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**results, "args": {**vars(args), "json": str(path)}, "cpus": os.cpu_count(),
                                "load_avg": os.getloadavg()}, indent=1, default=str))  # paths (--tree) as text


def unwind_on_signals() -> None:
    """SIGTERM, and SIGINT even where a shell that started the bench in the background ignores it,
    end the bench through its `finally` blocks, which stop the platform and servers it started (by
    default SIGTERM ends the process there and then, and they run on)."""
    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_processes(procs: list[subprocess.Popen | None], grace_s: float = 30) -> None:
    """SIGTERM each process the bench started, then SIGKILL what is left of it (its children too:
    a vLLM server's engine processes) after `grace_s`. Never raises: a stop that fails must not
    skip the next one."""
    procs = [p for p in procs if p is not None]
    trees = {}
    for proc in procs:
        try:
            trees[proc.pid] = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            trees[proc.pid] = []
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for child in trees[proc.pid]:
            with contextlib.suppress(psutil.Error):  # (it may end by itself meanwhile)
                child.kill()
