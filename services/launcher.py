"""`mship start`: an embedded single-node Ray head with Serve and the platform's services.

It composes the services into one platform, so it lives with them; the CLI (a client) only calls
`start_platform` / `stop_platform`.

state (gRPC) -> coordinator (gRPC, deploys model apps) -> gateway (HTTP, N replicas on one
SO_REUSEPORT port). Serve runs without its own proxies: every service serves its own port.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from services.common.vocabulary import ENV_COMPACTION_KEY, PLATFORM_ENV

log = logging.getLogger(__name__)
NAMESPACE = "mship"
STATE_APP, COORDINATOR_APP, GATEWAY_APP = "mship-state", "mship-coordinator", "mship-gateway"

# Serve defaults that break on a busy small node (measured in shared/notes/ray-serve-llama.md).
RAY_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Replicas run their code on the main loop, the one Serve's own gRPC server polls from: gRPC's
    # asyncio layer wakes every loop in a process that uses gRPC for every event, so with our
    # servers on Serve's separate user-code loop each streamed token woke two threads. Set for the
    # whole job (not per deployment), so replicas still start in Ray's pre-started worker processes.
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
}
ENGINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass
class PlatformConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000
    coordinator_port: int = 50051
    state_port: int = 50052
    state_store: str = "memory://"
    gateway_replicas: int = 1
    num_cpus: int = 0  # logical CPUs for Ray; 0 = 4 per physical core (replicas are small)
    ray_address: str | None = None  # join this Ray cluster (e.g. "auto" under KubeRay) instead of embedding one

    @property
    def coordinator_address(self) -> str:
        return f"{self.host}:{self.coordinator_port}"

    @property
    def state_address(self) -> str:
        return f"{self.host}:{self.state_port}"


def start_platform(cfg: PlatformConfig) -> None:
    for key, value in {**RAY_ENV, **ENGINE_ENV}.items():
        os.environ.setdefault(key, value)
    if cfg.host.startswith("127."):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback
    import ray
    from ray import serve

    from services.coordinator.deployment import CoordinatorDeployment
    from services.gateway.deployment import GatewayDeployment
    from services.gateway.responses.compaction import CompactionCodec
    from services.state.deployment import StateDeployment

    # Compaction items must open on every gateway replica: one key for the cluster (set it to keep
    # compacted chains valid across restarts).
    os.environ.setdefault(ENV_COMPACTION_KEY, CompactionCodec.new_key())
    env_vars = {k: os.environ[k] for k in (*RAY_ENV, *ENGINE_ENV, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                            "VLLM_CPU_KVCACHE_SPACE", *PLATFORM_ENV)
                if k in os.environ}
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, namespace=NAMESPACE, log_to_driver=False,
                 runtime_env={"env_vars": env_vars})
    else:
        ray.init(address="local", num_cpus=cfg.num_cpus or 4 * (os.cpu_count() or 2), include_dashboard=False,
                 namespace=NAMESPACE, log_to_driver=False, runtime_env={"env_vars": env_vars},
                 _node_ip_address=cfg.host if cfg.host.startswith("127.") else None)
    serve.start(proxy_location="Disabled")
    serve.run(StateDeployment.bind(cfg.host, cfg.state_port, cfg.state_store), name=STATE_APP, route_prefix=None)
    serve.run(CoordinatorDeployment.bind(cfg.host, cfg.coordinator_port, cfg.state_address),
              name=COORDINATOR_APP, route_prefix=None)
    serve.run(GatewayDeployment.options(num_replicas=cfg.gateway_replicas).bind(
        cfg.host, cfg.http_port, cfg.coordinator_address, cfg.state_address), name=GATEWAY_APP, route_prefix=None)


def stop_platform(grace_s: float = 10.0) -> None:
    """Stop Serve and Ray, then end any process of ours that outlived them (Ray's agents can)."""
    import psutil
    import ray
    from ray import serve

    ours = psutil.Process().children(recursive=True)
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
    alive = [p for p in ours if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        with contextlib.suppress(psutil.Error):
            p.kill()
