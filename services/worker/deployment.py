"""The worker as a Ray Serve deployment: one per model version, any number of replicas.

Each replica starts the worker's own grpc.aio server on its node (ephemeral port), loads and warms
the engine, then registers the endpoint with the coordinator. Tokens never pass through Serve:
the gateway calls this server directly. Serve owns placement, replica counts, health-driven
restarts and rolling replacement.
"""

from __future__ import annotations

import asyncio
import logging
import os

import ray
from ray import serve

from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as cpb
from services.common.autoscaling import autoscaling_config
from services.common.logs import configure_logging
from services.common.tracing import configure_tracing
from services.common.vocabulary import DEFAULT_REPLICA_CPUS, capability_resource, loader_name, stream_drain_s
from services.worker import metrics
from services.worker.engine_metrics import sample_forever
from services.worker.llama_server import STOP_GRACE_S
from services.worker.registration import LEAVE_TIMEOUT_S, Registrar, node_lease
from services.worker.server import WorkerServer, start_worker_server

log = logging.getLogger(__name__)
# How long a stopping replica lets its in-flight calls finish: STREAM_DRAIN_S while its version
# serves; a version a deploy retired had the deploy's own drain first (drain_timeout_s).
STREAM_DRAIN_S = stream_drain_s()
RETIRED_DRAIN_S = 20.0
# Serve kills a replica this long after it asked it to stop. Stopping is: leave routing (one call
# to the coordinator), drain the in-flight calls, stop the engine (a llama-server gets SIGTERM,
# then SIGKILL). All of it must fit, or the kill lands mid-stop: the engine's process is left
# behind, its memory held.
GRACEFUL_SHUTDOWN_S = LEAVE_TIMEOUT_S + max(STREAM_DRAIN_S, RETIRED_DRAIN_S) + STOP_GRACE_S + 3.0


@serve.deployment(
    ray_actor_options={"num_cpus": 0.5},
    health_check_period_s=2,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
    graceful_shutdown_wait_loop_s=0.5,
    max_ongoing_requests=4,  # Serve handle calls are control only (health, stats)
)
class WorkerDeployment:
    async def __init__(self, spec_bytes: bytes, version: str, coordinator: str) -> None:
        configure_logging("worker")
        configure_tracing("worker")
        spec = common_pb2.ModelSpec.FromString(spec_bytes)
        context = serve.get_replica_context()
        host = ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        replica_id = context.replica_id.unique_id
        self.server: WorkerServer = await start_worker_server(
            spec, host=host, port=0, gate=lambda: node_lease(coordinator, node_id, replica_id))
        await self.server.host.wait_ready()  # raises on a failed load: Serve reports the replica failed
        engine = self.server.host.engine
        replica = cpb.ReplicaInfo(
            replica_id=replica_id, model=spec.name, version=version,
            endpoint=common_pb2.Endpoint(host=host, port=self.server.port), node_id=node_id, pid=os.getpid(),
            max_model_len=engine.max_model_len if engine else 0, spec=spec,
            engine_load_s=self.server.host.load_seconds(),
            embedding_dimension=engine.embedding_dimension if engine else 0,
            accepts_images=bool(engine and engine.accepts_images))
        metrics.LOAD_SECONDS.labels(spec.name).set(replica.engine_load_s)
        metrics.ENGINE_DEATHS.labels(spec.name)  # at 0 from the start: an alert's increase() sees the first one
        self.registrar = Registrar(coordinator, replica, self._load, self.server.servicer.gate.apply)
        await self.registrar.start()
        self._engine_metrics = asyncio.get_running_loop().create_task(sample_forever(engine, spec.name)) \
            if engine is not None else None
        log.info("worker %s (%s) serving on %s:%d", spec.name, version, host, self.server.port)

    async def check_health(self) -> None:
        """Serve restarts a replica whose engine died (without this it would stay RUNNING, broken)."""
        if not await self.server.host.check():
            raise RuntimeError("the engine is not healthy")

    def _load(self) -> cpb.HeartbeatRequest:
        """What each heartbeat reports: the calls in flight (running + queued) and the engine's health
        (and, sampled as often, the replica's gauges)."""
        servicer, engine, model = self.server.servicer, self.server.host.engine, self.registrar.replica.model
        metrics.RUNNING.labels(model).set(servicer.gate.ongoing)
        metrics.QUEUED.labels(model).set(servicer.gate.queued)
        if engine is not None:
            metrics.KV_CACHE.labels(model).set(engine.stats().kv_cache_usage)
        return cpb.HeartbeatRequest(inflight_calls=len(servicer.inflight), running_requests=servicer.gate.ongoing,
                                    waiting_requests=servicer.gate.queued, limits=servicer.gate.limits,
                                    unhealthy=not self.server.host.ready)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Traffic bypasses Serve, so autoscaling is fed the worker's own in-flight calls."""
        return {"inflight": float(len(self.server.servicer.inflight))}

    def wake(self) -> None:
        """Nothing: a call that waits for a replica is what scales a deployment at zero replicas to
        one (the coordinator makes it for a gateway holding a request for this model)."""

    def address(self) -> str:
        return f"{self.registrar.replica.endpoint.host}:{self.server.port}"

    async def __del__(self) -> None:
        # Leave routing first so no new call arrives, then let in-flight streams finish. (Either may
        # be missing when __init__ failed: a failed load never registered.)
        if getattr(self, "_engine_metrics", None) is not None:
            self._engine_metrics.cancel()
        routed = True
        if hasattr(self, "registrar"):
            routed = await self.registrar.stop()
        if hasattr(self, "server"):
            grace_s = STREAM_DRAIN_S if routed else RETIRED_DRAIN_S
            log.info("stopping: %d calls in flight may finish within %.0f s (%s)", len(self.server.servicer.inflight),
                     grace_s, "its version serves" if routed else "its version was retired")
            await self.server.stop(grace_s=grace_s)


def worker_app(spec: common_pb2.ModelSpec, version: str, coordinator: str):
    """The Serve application of one model version (replica count and resources from the spec)."""
    # The loader's capability resource: Ray places a replica only on a node that runs its engine.
    options: dict = {"name": "worker",
                     "ray_actor_options": {"num_cpus": spec.num_cpus or DEFAULT_REPLICA_CPUS, "num_gpus": spec.num_gpus,
                                           "resources": {capability_resource(loader_name(spec.loader)): 1}}}
    if spec.HasField("autoscaling"):
        a = spec.autoscaling
        options["autoscaling_config"] = autoscaling_config(
            a.min_replicas, a.max_replicas, a.target_ongoing_requests or 2.0, a.upscale_delay_s, a.downscale_delay_s)
    else:
        options["num_replicas"] = spec.num_replicas or 1
    return WorkerDeployment.options(**options).bind(spec.SerializeToString(), version, coordinator)
