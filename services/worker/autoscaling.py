"""Serve autoscaling policy on the workers' own in-flight gRPC calls (Serve cannot see them)."""

from __future__ import annotations

import math
from typing import Any

from ray.serve.config import AutoscalingContext


def inflight_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    per_replica = (ctx.aggregated_metrics or {}).get("inflight", {})
    total = sum(per_replica.values())
    target = ctx.config.target_ongoing_requests or 2.0
    # Serve clamps to [min, max] and applies the up/down-scale delays around this raw wish.
    return max(1, math.ceil(total / target)), {"inflight": total}
