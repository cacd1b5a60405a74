"""What every bench shares: percentiles, and the JSON file it writes with its run's context."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); NaN for no values."""
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))] if values else float("nan")


def write_json(path: Path, args: argparse.Namespace, **results: Any) -> None:
    """`results` plus the arguments, CPU count and load average the numbers were taken with."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**results, "args": {**vars(args), "json": str(path)}, "cpus": os.cpu_count(),
                                "load_avg": os.getloadavg()}, indent=1, default=str))  # paths (--tree) as text
