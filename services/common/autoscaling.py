"""Serve autoscaling on the replicas' own in-flight calls, for workers and gateways alike.

Their traffic bypasses Serve (each replica serves its own gRPC or HTTP port), so Serve cannot count
it: every replica reports `inflight` through `record_autoscaling_stats()` and `inflight_policy`
turns the sum into a replica count. Serve wraps the policy: it clamps to [min, max], applies the
up/down-scale delays, and scales a deployment at zero replicas to one as soon as a handle call
waits for it (the cold-start path: `WorkerDeployment.wake`).
"""

from __future__ import annotations

import math
from typing import Any

from ray.serve.config import AutoscalingContext

POLICY = "services.common.autoscaling:inflight_policy"
METRICS_INTERVAL_S = 0.5  # Serve's default (10 s) makes a scale-up late by that much
LOOK_BACK_PERIOD_S = 2.0


def inflight_policy(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    per_replica = (ctx.aggregated_metrics or {}).get("inflight", {})
    # Serve's own count: handle calls running or waiting (a wake call waiting for a replica).
    total = sum(per_replica.values()) + ctx.total_num_requests
    target = ctx.config.target_ongoing_requests or 2.0
    return math.ceil(total / target), {"inflight": total}


def autoscaling_config(min_replicas: int, max_replicas: int, target_ongoing_requests: float,
                       upscale_delay_s: float, downscale_delay_s: float) -> dict[str, Any]:
    """Serve's `autoscaling_config` for a deployment whose replicas report `inflight`."""
    return {"min_replicas": min_replicas, "max_replicas": max_replicas,
            # A deploy starts one replica even at min 0: it proves the model loads, then idles to zero.
            "initial_replicas": max(1, min_replicas),
            "target_ongoing_requests": target_ongoing_requests, "upscale_delay_s": upscale_delay_s,
            "downscale_delay_s": downscale_delay_s, "downscale_to_zero_delay_s": downscale_delay_s,
            "metrics_interval_s": METRICS_INTERVAL_S, "look_back_period_s": LOOK_BACK_PERIOD_S,
            "policy": {"policy_function": POLICY}}
