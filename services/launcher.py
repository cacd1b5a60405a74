"""`mship start`: a Ray head node of this machine with Serve and the platform's services.

It composes the services into one platform, so it lives with them; the CLI (a client) only calls
`Platform.start` / `Platform.stop`. Other machines join the head's Ray cluster (`mship join`);
every address handed to a service is one other nodes can dial (`advertised_address`).

state (gRPC) -> coordinator (gRPC, deploys model apps) -> gateway (HTTP, N replicas on one
SO_REUSEPORT port). Serve runs without its own proxies: every service serves its own port.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

from services.cluster.capabilities import node_capabilities, resources
from services.cluster.ports import check_free, is_loopback
from services.cluster.ray_node import NodeConfig, RayNode
from services.common.vocabulary import ENV_COMPACTION_KEY, ENV_RAY_AUTH_TOKEN, PLATFORM_ENV

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
HEAD_START_TIMEOUT_S = 60.0


@dataclass
class PlatformConfig:
    host: str = "127.0.0.1"  # what the services bind
    http_port: int = 8000
    coordinator_port: int = 50051
    state_port: int = 50052
    gcs_port: int = 6380  # the head's Ray GCS (not Redis's 6379)
    state_store: str = "memory://"
    gateway_replicas: int = 1
    num_cpus: int = 0  # logical CPUs for Ray; 0 = 4 per physical core (replicas are small)
    ray_address: str | None = None  # join this Ray cluster (e.g. "auto" under KubeRay) instead of embedding one
    advertise_address: str | None = None  # what other nodes dial; None: see `advertised_address`
    token: str | None = None  # the cluster token: Ray token auth and the platform's gRPC; None: auth off
    models_on_head: bool = True  # False: the head advertises no engine capability
    capabilities: list[str] | None = None  # the head's engines; None: probed (MSHIP_NODE_CAPABILITIES overrides)
    expected_models: list[str] = field(default_factory=list)  # the start set: /readyz waits for them

    def __post_init__(self) -> None:
        if self.advertise_address is None:
            self.advertise_address = advertised_address(self.host)

    @property
    def coordinator_address(self) -> str:
        return f"{self.advertise_address}:{self.coordinator_port}"

    @property
    def state_address(self) -> str:
        return f"{self.advertise_address}:{self.state_port}"

    def ports(self) -> dict[str, tuple[str, int]]:
        """flag -> (host, port) of every port this platform binds on this machine."""
        out = {"--http-port": (self.host, self.http_port), "--coordinator-port": (self.host, self.coordinator_port),
               "--state-port": (self.host, self.state_port)}
        if not self.ray_address:
            out["--gcs-port"] = (self.advertise_address or self.host, self.gcs_port)
        return out


def advertised_address(host: str) -> str:
    """The address other nodes reach this one at: loopback when everything is local, the bound
    address when it is a specific one, else the node's IP as Ray sees it (never 0.0.0.0)."""
    if is_loopback(host):
        return "127.0.0.1"
    if host not in ("0.0.0.0", "::", ""):
        return host
    from ray._private.services import node_ip_address_from_perspective

    return node_ip_address_from_perspective()


# Coordinator and state listen on the head: their ports are the ones operators open.
ON_HEAD = {"node:__internal_head__": 0.001}


class Platform:
    """The head's platform: a Ray head node process (unless attached to `ray_address`), Serve and
    the services. `stop` ends what `start` started, also after a failed start."""

    def __init__(self, cfg: PlatformConfig) -> None:
        self.cfg = cfg
        self.node: RayNode | None = None

    def start(self) -> None:
        cfg = self.cfg
        check_free(cfg.ports())
        for key, value in {**RAY_ENV, **ENGINE_ENV}.items():
            os.environ.setdefault(key, value)
        if cfg.token:  # this driver, the head node's processes and the CLI's own calls carry it
            os.environ.update({ENV_RAY_AUTH_TOKEN: cfg.token, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cfg.token})
        elif not cfg.ray_address:  # explicit, as for the head node (ray_node.NodeConfig.env)
            os.environ["RAY_AUTH_MODE"] = "disabled"
        if is_loopback(cfg.ray_address.rsplit(":", 1)[0] if cfg.ray_address else cfg.advertise_address or ""):
            # Read when ray is imported: without it, ray.init rewrites a loopback address to the
            # machine's routable one, where a loopback head does not listen.
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
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
        address = cfg.ray_address or self._start_head()
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, runtime_env={"env_vars": env_vars})
        serve.start(proxy_location="Disabled")
        on_head = {"ray_actor_options": {"num_cpus": 0.1, "resources": ON_HEAD}}
        serve.run(StateDeployment.options(**on_head).bind(cfg.host, cfg.state_port, cfg.state_store),
                  name=STATE_APP, route_prefix=None)
        serve.run(CoordinatorDeployment.options(**on_head).bind(
            cfg.host, cfg.coordinator_port, cfg.state_address, cfg.coordinator_address, cfg.expected_models),
            name=COORDINATOR_APP, route_prefix=None)
        serve.run(GatewayDeployment.options(num_replicas=cfg.gateway_replicas).bind(
            cfg.host, cfg.http_port, cfg.coordinator_address, cfg.state_address, rate_store=cfg.state_store),
            name=GATEWAY_APP, route_prefix=None)

    def _start_head(self) -> str:
        cfg = self.cfg
        caps = (cfg.capabilities if cfg.capabilities is not None else node_capabilities()) if cfg.models_on_head \
            else []
        self.node = RayNode(NodeConfig(
            head=True, gcs_port=cfg.gcs_port, node_ip=cfg.advertise_address,
            num_cpus=cfg.num_cpus or 4 * (os.cpu_count() or 2), resources=resources(caps), token=cfg.token,
            drain_timeout_s=0))  # the platform stops Serve before its head: nothing left to drain
        self.node.wait_started(HEAD_START_TIMEOUT_S)
        log.info("Ray head on %s:%d, capabilities %s", cfg.advertise_address, cfg.gcs_port, caps)
        return f"{cfg.advertise_address}:{cfg.gcs_port}"

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop Serve and Ray, then end any process of ours that outlived them (Ray's agents can)."""
        import psutil

        ours = psutil.Process().children(recursive=True)
        try:
            import ray
            from ray import serve

            if ray.is_initialized():
                try:
                    _cancel_unplaced_replicas()
                    serve.shutdown()
                finally:
                    ray.shutdown()
        finally:
            if self.node is not None:
                self.node.stop(grace_s)
            alive = [p for p in ours if p.is_running()]
            for p in alive:
                with contextlib.suppress(psutil.Error):
                    p.terminate()
            _, still = psutil.wait_procs(alive, timeout=grace_s)
            for p in still:
                with contextlib.suppress(psutil.Error):
                    p.kill()


def _cancel_unplaced_replicas() -> None:
    """Kill replica actors still waiting for a node (a model no node can host): Serve would give
    each one its whole graceful-shutdown timeout (30 s) to stop, which a replica that never
    started cannot do. (A replica Serve has not even created an actor for yet still costs that
    wait: Serve 2.60 offers no way around it.)"""
    import ray
    from ray._private import state
    from ray.serve._private.constants import SERVE_NAMESPACE

    try:
        actors = state.actors().values()  # from the GCS: the state API needs the dashboard
    except Exception as e:  # best effort: shutdown goes on without it
        log.info("cannot list waiting replicas: %s", e)
        return
    for actor in actors:
        if actor.get("State") == "PENDING_CREATION" and str(actor.get("ActorClassName", "")).startswith(
                "ServeReplica") and actor.get("Name"):
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(actor["Name"], namespace=SERVE_NAMESPACE))
