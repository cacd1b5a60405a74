"""The `mship.coordinator.v1.Coordinator` servicer: deploys, leases, registrations, routing watch.

Refusals are raised as `ServiceError`; the server's interceptor turns them into the call's status."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.cluster.capabilities import capabilities_of
from services.common.errors import Reason, ServiceError, invalid_parameter
from services.common.limits import scales_to_zero
from services.coordinator.deploy_log import DeployRecord
from services.coordinator.deployer import Deployer
from services.coordinator.fingerprint import version_of
from services.coordinator.leases import LeaseManager
from services.coordinator.placement import unhostable
from services.coordinator.registry import ReplicaRegistry
from services.coordinator.serve_control import ServeControl
from services.coordinator.spec_rules import check_deploy

log = logging.getLogger(__name__)
WAKE_TIMEOUT_S = 600.0  # a cold start loads a model: minutes for a large one
WAKE_RETRY_S = 30.0  # a wake that failed is not tried again sooner
DEFAULT_LEASE_TTL_S = 30.0
MAX_LEASE_S = 3600.0  # a lease's TTL and an acquire's wait: a loader renews well within it


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, registry: ReplicaRegistry, deployer: Deployer, leases: LeaseManager, serve: ServeControl,
                 heartbeat_interval_s: float = 1.0, keepalive_s: float = 5.0) -> None:
        self.registry, self.deployer, self.leases, self.serve = registry, deployer, leases, serve
        self.heartbeat_interval_s = heartbeat_interval_s
        self.keepalive_s = keepalive_s
        # Held back after a restart until the running replicas have re-registered, so that no
        # subscriber ever receives a blank snapshot from a coordinator that has not caught up yet.
        self.routing_ready = asyncio.Event()
        self._waking: dict[str, asyncio.Task] = {}  # app -> its wake call (RequestReplica)
        self._wake_failed: dict[str, tuple[str, float]] = {}  # app -> why its last wake failed, until when

    # ---- deploys -----------------------------------------------------------------------------
    async def Deploy(self, request: pb.DeployRequest, context) -> AsyncIterator[pb.DeployEvent]:
        check_deploy(request)
        record = self.deployer.start(request)
        async for event in record.follow():  # closing this stream stops following, not the deploy
            yield event

    async def GetDeployment(self, request: pb.GetDeploymentRequest, context) -> pb.Deployment:
        return _found(self.deployer.get(request.deploy_id), request.deploy_id).to_proto()

    async def CancelDeploy(self, request: pb.CancelDeployRequest, context) -> pb.Deployment:
        return _found(await self.deployer.cancel(request.deploy_id), request.deploy_id).to_proto()

    # ---- leases ------------------------------------------------------------------------------
    async def AcquireLease(self, request: pb.AcquireLeaseRequest, context) -> pb.Lease:
        if not request.node_id or not request.holder:
            raise invalid_parameter("node_id", "node_id and holder are required")
        _check_lease_times(request.ttl_s, request.wait_s)
        lease = await self.leases.acquire(request.node_id, request.holder, request.ttl_s, request.wait_s)
        if lease is None:
            return pb.Lease(granted=False, node_id=request.node_id)
        return pb.Lease(lease_id=lease.lease_id, granted=True, node_id=lease.node_id, holder=lease.holder,
                        expires_at=lease.expires_at)

    async def RenewLease(self, request: pb.RenewLeaseRequest, context) -> pb.Lease:
        _check_lease_times(request.ttl_s or DEFAULT_LEASE_TTL_S)
        lease = await self.leases.renew(request.lease_id, request.ttl_s or DEFAULT_LEASE_TTL_S)
        if lease is None:
            return pb.Lease(lease_id=request.lease_id, granted=False)
        return pb.Lease(lease_id=lease.lease_id, granted=True, node_id=lease.node_id, holder=lease.holder,
                        expires_at=lease.expires_at)

    async def ReleaseLease(self, request: pb.ReleaseLeaseRequest, context) -> pb.ReleaseLeaseResponse:
        await self.leases.release(request.lease_id)
        return pb.ReleaseLeaseResponse()

    async def ListLeases(self, request: pb.ListLeasesRequest, context) -> pb.ListLeasesResponse:
        return pb.ListLeasesResponse(leases=self.leases.records(request.node_id))

    # ---- replicas and routing ----------------------------------------------------------------
    async def RegisterReplica(self, request: pb.RegisterReplicaRequest, context) -> pb.RegisterReplicaResponse:
        info = request.replica
        if not info.replica_id or not info.model or not info.endpoint.port:
            raise invalid_parameter("replica", "replica_id, model and endpoint are required")
        if not info.version and info.HasField("spec"):
            info.version = version_of(info.spec)
        await self.registry.register(info)
        return pb.RegisterReplicaResponse(heartbeat_interval_s=self.heartbeat_interval_s)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context) -> pb.HeartbeatResponse:
        if request.leaving:
            routed = self.registry.routed(request.replica_id)
            await self.registry.unregister(request.replica_id)
            return pb.HeartbeatResponse(known=False, routed=routed)
        limits = await self.registry.heartbeat(request)
        return pb.HeartbeatResponse(known=limits is not None, limits=limits)

    async def WatchRouting(self, request: pb.WatchRoutingRequest, context) -> AsyncIterator[pb.RoutingUpdate]:
        await self.routing_ready.wait()
        known = request.known_version
        while True:
            if self.registry.version != known:  # stale (or from an older coordinator): full snapshot
                snapshot = self.registry.snapshot()
                known = snapshot.version
                yield pb.RoutingUpdate(snapshot=snapshot)
            elif not await self.registry.wait_newer(known, self.keepalive_s):
                yield pb.RoutingUpdate(keepalive=pb.Keepalive(version=known))

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        out = pb.ListModelsResponse(routing_version=self.registry.version)
        for model in self.deployer.running_models():
            out.models.append(pb.ModelInfo(spec=model.spec, version=model.version, app_name=model.app,
                                           ready_replicas=len(self.registry.live(model.spec.name, model.version)),
                                           load_time_s=model.load_time_s))
        if request.include_serve_apps:
            for name, app in sorted((await self.serve.model_apps()).items()):
                out.apps.append(pb.ServeApp(name=name, status=app.status, running_replicas=app.running_replicas,
                                            target_replicas=app.target_replicas))
        return out


    async def ClusterStatus(self, request: pb.ClusterStatusRequest, context) -> pb.ClusterStatusResponse:
        nodes = await self.serve.nodes()
        out = pb.ClusterStatusResponse(nodes=[
            pb.NodeStatus(node_id=n.node_id, name=n.name, address=n.address, alive=n.alive, is_head=n.is_head,
                          capabilities=capabilities_of(n.resources), resources=n.resources) for n in nodes])
        for model in self.deployer.running_models():
            name, version = model.spec.name, model.version
            replicas = self.registry.replicas_of(name, version)
            status = out.models.add(name=name, version=version)
            for r in replicas:
                status.replicas.add(replica_id=r.info.replica_id, node_id=r.info.node_id,
                                    endpoint=f"{r.info.endpoint.host}:{r.info.endpoint.port}",
                                    state=self.registry.state_of(r), running_requests=r.load.running_requests,
                                    queued_requests=r.load.waiting_requests, limits=r.load.limits)
            if not replicas and not scales_to_zero(model.spec):
                out.pending.add(name=name, reason=unhostable(model.spec, nodes) or "loading: no live replica yet")
        return out

    async def RequestReplica(self, request: pb.RequestReplicaRequest, context) -> pb.RequestReplicaResponse:
        await self.routing_ready.wait()  # after a restart: the models are known once recovery adopted them
        model = next((m for m in self.deployer.running_models() if m.spec.name == request.model), None)
        if model is None:
            return pb.RequestReplicaResponse(reason=f"no model {request.model!r} is deployed")
        if not scales_to_zero(model.spec):
            return pb.RequestReplicaResponse(reason=f"{request.model!r} does not scale to zero")
        failed = self._wake_failed.get(model.app)
        if failed is not None and asyncio.get_running_loop().time() < failed[1]:
            return pb.RequestReplicaResponse(reason=failed[0])  # callers answer at once, not at their deadline
        if not self.registry.live(model.spec.name, model.version) and model.app not in self._waking:
            self._waking[model.app] = asyncio.get_running_loop().create_task(self._wake(model.app))
        return pb.RequestReplicaResponse(starting=True)

    async def _wake(self, app: str) -> None:
        """One wake per app at a time, however many gateways ask (their requests wait on routing).
        One that failed is the answer to the asks of the next WAKE_RETRY_S, then it is tried again."""
        try:
            await asyncio.wait_for(self.serve.wake(app), WAKE_TIMEOUT_S)
            self._wake_failed.pop(app, None)
        except Exception as e:
            log.warning("starting a replica of %s failed: %r", app, e)
            self._wake_failed[app] = (f"starting a replica failed: {e!r}",
                                      asyncio.get_running_loop().time() + WAKE_RETRY_S)
        finally:
            del self._waking[app]


def _found(record: DeployRecord | None, deploy_id: str) -> DeployRecord:
    if record is None:
        raise ServiceError(grpc.StatusCode.NOT_FOUND, Reason.NOT_FOUND, f"no deploy {deploy_id!r}")
    return record


def _check_lease_times(ttl_s: float, wait_s: float = 0.0) -> None:
    """A lease that never expires would hold its node's loaders back for good."""
    if not 0 < ttl_s <= MAX_LEASE_S:  # (NaN fails it too)
        raise invalid_parameter("ttl_s", f"ttl_s must be > 0 and <= {MAX_LEASE_S:.0f} seconds")
    if not 0 <= wait_s <= MAX_LEASE_S:
        raise invalid_parameter("wait_s", f"wait_s must be >= 0 and <= {MAX_LEASE_S:.0f} seconds")
