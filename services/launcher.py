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
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from services.cluster.capabilities import node_capabilities, node_resources
from services.cluster.ports import check_free, is_loopback
from services.cluster.ray_node import NodeConfig, RayNode, gcs_redis_password
from services.cluster.shutdown import StopDeadline, end_processes
from services.cluster.telemetry import NodeTelemetry, ServiceDiscoveryFile
from services.common.vocabulary import (
    ENV_API_KEYS,
    ENV_API_KEYS_FILE,
    ENV_CACHE_DIR,
    ENV_COMPACTION_KEY,
    ENV_RAY_AUTH_TOKEN,
    ENV_TRUST_IDENTITY_HEADER,
    ENV_TRUSTED_IDENTITY_HEADER,
    GATEWAY_RESOURCE,
    PLATFORM_ENV,
)

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
GRPC_EXPERIMENTS = "GRPC_EXPERIMENTS"  # gRPC core's switch for its experiments, read when a process starts
HEAD_START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0  # `mship start --stop-timeout`: the whole stop, drains included
STOP_RESERVE_S = 10.0  # of it, kept back from Serve's drain for the kills and the processes after
KILL_STEP_S = 3.0  # each step of the forced path (kill Serve's actors, leave Ray)


@dataclass
class PlatformConfig:
    host: str = "127.0.0.1"  # what the services bind
    http_port: int = 8000
    coordinator_port: int = 50051
    state_port: int = 50052
    gcs_port: int = 6380  # the head's Ray GCS (not Redis's 6379)
    state_store: str = "memory://"
    gateway_replicas: int = 1  # a fixed count; or autoscaling between these two:
    gateway_min_replicas: int = 0
    gateway_max_replicas: int = 0  # > 0: Serve scales the gateways on their in-flight requests
    gateway_target_ongoing_requests: float = 64.0  # per gateway replica
    num_cpus: float = 0  # logical CPUs the head offers Ray; 0 = 4 per CPU of os.cpu_count() (replicas are small)
    memory: int | None = None  # bytes the head offers Ray; None: Ray's own count
    ray_monitor: bool = True  # False: an external autoscaler (KubeRay's) manages the cluster
    ray_address: str | None = None  # join this Ray cluster (e.g. "auto" under KubeRay) instead of embedding one
    advertise_address: str | None = None  # what other nodes dial; None: see `advertised_address`
    token: str | None = None  # the cluster token: Ray token auth and the platform's gRPC; None: auth off
    models_on_head: bool = True  # False: the head advertises no engine capability
    capabilities: list[str] | None = None  # the head's engines; None: probed (MSHIP_NODE_CAPABILITIES overrides)
    expected_models: list[str] = field(default_factory=list)  # the start set: /readyz waits for them
    # The head node's metrics, log target, trace endpoint (`mship start --metrics-port ...`).
    telemetry: NodeTelemetry = field(default_factory=lambda: NodeTelemetry(metrics=False))

    def __post_init__(self) -> None:
        if self.advertise_address is None:
            self.advertise_address = advertised_address(self.host)

    @property
    def coordinator_address(self) -> str:
        return f"{self.advertise_address}:{self.coordinator_port}"

    @property
    def state_address(self) -> str:
        return f"{self.advertise_address}:{self.state_port}"

    @property
    def service_discovery_file(self) -> Path:
        """Prometheus `file_sd` targets: every node's metrics port (one file per platform on a host)."""
        root = Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "mship")
        return root / "run" / f"prometheus-sd-{self.coordinator_port}.json"

    def ports(self) -> dict[str, tuple[str, int]]:
        """flag -> (host, port) of every port this platform binds on this machine."""
        out = {"--http-port": (self.host, self.http_port), "--coordinator-port": (self.host, self.coordinator_port),
               "--state-port": (self.host, self.state_port)}
        if not self.ray_address:
            out["--gcs-port"] = (self.advertise_address or self.host, self.gcs_port)
        if self.telemetry.metrics:
            out["--metrics-port"] = (self.host, self.telemetry.metrics_port)
        return out


def gateway_scale(cfg: PlatformConfig) -> dict:
    """The gateway deployment's replica options: a fixed count, or autoscaling on in-flight requests."""
    if not cfg.gateway_max_replicas:
        return {"num_replicas": cfg.gateway_replicas}
    from services.common.autoscaling import autoscaling_config

    low = max(1, cfg.gateway_min_replicas)  # at zero nobody would listen for the request that wakes one
    return {"autoscaling_config": autoscaling_config(low, max(low, cfg.gateway_max_replicas),
                                                     cfg.gateway_target_ongoing_requests, 1.0, 30.0)}


def gateway_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the gateway's replicas get on top of the job's environment: gRPC's legacy client I/O,
    unless the operator's own GRPC_EXPERIMENTS decides. The EventEngine client reads each message
    on an I/O thread and hands it to the event loop through the completion-queue poller thread; the
    legacy client reads it on the poller thread itself. For the gateway, one Infer message per
    streamed token, that is 20-27% less CPU per token (bench/gateway_cpu.py, docs/operations.md).
    The cost: a gateway replica starts in a Ray worker process of its own, not a pre-started one."""
    chosen = env.get(GRPC_EXPERIMENTS, "")
    if "event_engine_client" in chosen:
        return {}
    return {GRPC_EXPERIMENTS: ",".join(e for e in (chosen, "-event_engine_client") if e)}


def gateway_options(cfg: PlatformConfig, actor_options: dict, env: Mapping[str, str] = os.environ) -> dict:
    """The gateway deployment's options: its scale, its environment (`gateway_env`), and (on the
    deployment's own `actor_options`, which Serve's .options() would replace whole) its replicas
    only on nodes that advertise `mship_gateway`: the head, and joiners without `--no-gateway`.
    Attached to someone else's Ray cluster (`ray_address`) nothing advertises it: the replicas go
    anywhere there, as before."""
    actor = dict(actor_options)
    if not cfg.ray_address:
        actor["resources"] = {**actor.get("resources", {}), GATEWAY_RESOURCE: 1}
    if extra := gateway_env(env):  # Ray merges these into the job's env_vars
        actor["runtime_env"] = {"env_vars": extra}
    return {**gateway_scale(cfg), "ray_actor_options": actor}


def advertised_address(host: str) -> str:
    """The address other nodes reach this one at: loopback when everything is local, the bound
    address when it is a specific one, else the node's IP as Ray sees it (never 0.0.0.0)."""
    if is_loopback(host):
        return "127.0.0.1"
    if host not in ("0.0.0.0", "::", ""):
        return host
    from ray._private.services import node_ip_address_from_perspective

    return node_ip_address_from_perspective()


def head_node(cfg: PlatformConfig, env: Mapping[str, str] = os.environ) -> NodeConfig:
    """The Ray head node `mship start` runs (not in `ray_address` attach mode)."""
    caps = (cfg.capabilities if cfg.capabilities is not None else node_capabilities()) if cfg.models_on_head \
        else []
    return NodeConfig(
        head=True, gcs_port=cfg.gcs_port, node_ip=cfg.advertise_address,
        num_cpus=cfg.num_cpus or 4 * (os.cpu_count() or 2), memory=cfg.memory,
        resources=node_resources(caps, gateway=True), token=cfg.token,
        drain_timeout_s=0,  # the platform stops Serve before its head: nothing left to drain
        labels=cfg.telemetry.labels(), extra_env=cfg.telemetry.env(), agent_port=cfg.telemetry.agent_port,
        no_monitor=not cfg.ray_monitor,
        # The GCS in Redis (KubeRay's gcsFaultToleranceOptions): RAY_REDIS_ADDRESS and
        # RAY_external_storage_namespace reach Ray through the node's inherited environment.
        redis_password=gcs_redis_password(env))


def edge_access() -> str:
    """Who may call the OpenAI API, as the gateways will decide it (services.gateway.identity)."""
    if os.environ.get(ENV_API_KEYS) or os.environ.get(ENV_API_KEYS_FILE):
        return "API keys required (Authorization: Bearer KEY or x-api-key)"
    if header := os.environ.get(ENV_TRUSTED_IDENTITY_HEADER) or (
            "x-mship-identity" if os.environ.get(ENV_TRUST_IDENTITY_HEADER) == "1" else ""):
        return f"the identity in the {header} header, set by the proxy in front (nothing else is accepted)"
    return (f"open: no API keys, every caller is the one anonymous identity (one prefix cache, rate limits "
            f"per client address); set {ENV_API_KEYS} or {ENV_API_KEYS_FILE} to require keys")


# Coordinator and state listen on the head: their ports are the ones operators open.
ON_HEAD = {"node:__internal_head__": 0.001}


class Platform:
    """The head's platform: a Ray head node process (unless attached to `ray_address`), Serve and
    the services. `stop` ends what `start` started, also after a failed start."""

    def __init__(self, cfg: PlatformConfig) -> None:
        self.cfg = cfg
        self.node: RayNode | None = None
        self.discovery: ServiceDiscoveryFile | None = None

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
        from services.gateway.edge.http_server import migrates_queued_connections
        from services.gateway.responses.compaction import CompactionCodec
        from services.state.deployment import StateDeployment

        # Compaction items must open on every gateway replica: one key for the cluster (set it to keep
        # compacted chains valid across restarts).
        os.environ.setdefault(ENV_COMPACTION_KEY, CompactionCodec.new_key())
        env_vars = {k: os.environ[k] for k in (*RAY_ENV, *ENGINE_ENV, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                "VLLM_CPU_KVCACHE_SPACE", *PLATFORM_ENV)
                    if k in os.environ}
        cfg.telemetry.start()  # the node's metrics port first: its processes write there from their start
        address = cfg.ray_address or self._start_head()
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, runtime_env={"env_vars": env_vars})
        if cfg.telemetry.metrics:
            self.discovery = ServiceDiscoveryFile(cfg.service_discovery_file)
            self.discovery.start()
        serve.start(proxy_location="Disabled")
        on_head = {"ray_actor_options": {"num_cpus": 0.1, "resources": ON_HEAD}}
        serve.run(StateDeployment.options(**on_head).bind(cfg.host, cfg.state_port, cfg.state_store),
                  name=STATE_APP, route_prefix=None)
        serve.run(CoordinatorDeployment.options(**on_head).bind(
            cfg.host, cfg.coordinator_port, cfg.state_address, cfg.coordinator_address, cfg.expected_models),
            name=COORDINATOR_APP, route_prefix=None)
        if max(cfg.gateway_replicas, cfg.gateway_max_replicas) > 1 and not migrates_queued_connections():
            log.warning("net.ipv4.tcp_migrate_req is 0: a gateway replica that crashes or is scaled down resets "
                        "the connections the kernel queued on its port; `sysctl -w net.ipv4.tcp_migrate_req=1` "
                        "hands them to another replica (docs/operations.md, Gateway replicas)")
        serve.run(GatewayDeployment.options(**gateway_options(cfg, GatewayDeployment.ray_actor_options)).bind(
            cfg.host, cfg.http_port, cfg.coordinator_address, cfg.state_address, rate_store=cfg.state_store),
            name=GATEWAY_APP, route_prefix=None)

    def _start_head(self) -> str:
        cfg = self.cfg
        node = head_node(cfg)
        self.node = RayNode(node)
        self.node.wait_started(HEAD_START_TIMEOUT_S)
        log.info("Ray head on %s:%d, resources %s", cfg.advertise_address, cfg.gcs_port, node.resources)
        return f"{cfg.advertise_address}:{cfg.gcs_port}"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, hurry: threading.Event | None = None) -> StopDeadline:
        """End what `start` started (also after a failed start) within `timeout_s`: Serve drains
        its replicas while the deadline allows, then Ray and any process of ours that outlived it
        (Ray's agents can) stop. What the deadline, or `hurry` (a second signal), had to kill
        instead is recorded in the returned deadline: its `summary()` is the line to print."""
        deadline = StopDeadline(timeout_s, hurry)
        ours = _our_processes()
        try:
            if _ray_connected():
                _stop_serve_and_ray(deadline)
            elif _ray_loaded():  # a start interrupted inside ray.init: Ray's exit hook crashes on that driver
                deadline.exit_hard = True
        finally:
            if self.node is not None:
                deadline.killed_pids += self.node.stop(grace_s=deadline.remaining(), hurry=deadline.hurry)
            end_processes(ours, deadline)
            if self.discovery is not None:
                self.discovery.stop()
            self.cfg.telemetry.stop()
        return deadline


def _stop_serve_and_ray(deadline: StopDeadline) -> None:
    """Serve's graceful shutdown until the deadline's reserve; Serve's actors still alive then are
    killed (named in the deadline); then this driver leaves Ray."""
    reserve = min(STOP_RESERVE_S, deadline.timeout_s / 4)  # for the kills and the processes after
    budget = deadline.remaining(reserve)
    drain = deadline.run("Serve's shutdown", _drain_serve, budget, budget_s=budget)
    if not (drain.done and drain.value):
        if drain.error is not None:
            log.warning("Serve's shutdown failed: %r", drain.error)
        # The forced path: not cut short by a second signal, each step bounded on its own.
        kill = deadline.run("killing Serve's actors", _kill_serve_actors, budget_s=KILL_STEP_S, interruptible=False)
        if kill.done and kill.value is not None:
            replicas, controller = kill.value
            deadline.killed_replicas += replicas
            deadline.killed_controller = controller
        else:
            deadline.give_up(kill)
        # A dead controller ends the drain's wait; a Ray call still running forbids ray.shutdown.
        if not deadline.wait(lambda: drain.done, KILL_STEP_S, interruptible=False):
            deadline.give_up(drain)
            return
    disconnect = deadline.run("ray.shutdown", _disconnect_ray, budget_s=KILL_STEP_S, interruptible=False)
    if not disconnect.done:
        deadline.give_up(disconnect)


def _our_processes() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _ray_connected() -> bool:
    import ray

    return ray.is_initialized()


def _ray_loaded() -> bool:
    return "ray" in sys.modules


def _disconnect_ray() -> None:
    import ray

    ray.shutdown()


def _drain_serve(budget_s: float) -> bool:
    """Serve's own graceful shutdown, each replica draining in its `__del__` up to its
    graceful-shutdown timeout; True once Serve finished (its controller exits when all stopped),
    False when `budget_s` ran out first. (serve.shutdown() would wait a fixed 30 s, and not say.)"""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    _cancel_unplaced_replicas()
    try:
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:  # Serve never started (or is gone already)
        return True
    try:
        ray.get(controller.graceful_shutdown.remote(), timeout=budget_s)
    except ray.exceptions.GetTimeoutError:
        return False
    except ray.exceptions.RayActorError:  # how it ends: the controller killed itself
        pass
    return True  # (the driver's cached Serve client goes with ray.shutdown and the exit)


def _kill_serve_actors() -> tuple[list[str], bool]:
    """Kill Serve's controller (first: it would restart replicas) and every replica actor still
    alive. Returns (the replicas killed, as app#deployment#id; whether the controller was)."""
    import ray
    from ray._private import state
    from ray.serve._private.common import REPLICA_ID_FULL_ID_STR_PREFIX
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    live = [a for a in state.actors().values() if a.get("State") != "DEAD" and a.get("Name")]
    controller = [a for a in live if a["Name"] == SERVE_CONTROLLER_NAME]
    replicas = [a for a in live if str(a.get("ActorClassName", "")).startswith("ServeReplica")]
    killed = []
    for actor in controller + replicas:
        with contextlib.suppress(Exception):  # gone meanwhile: nothing to kill
            ray.kill(ray.get_actor(actor["Name"], namespace=SERVE_NAMESPACE), no_restart=True)
            killed.append(actor["Name"])
    return ([n.removeprefix(REPLICA_ID_FULL_ID_STR_PREFIX) for n in killed if n != SERVE_CONTROLLER_NAME],
            SERVE_CONTROLLER_NAME in killed)


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
