"""The coordinator's only contact with Ray Serve's control API: the `ServeControl` protocol the
deployer is written against (tests inject a fake), and `RayServeControl`, the real one. Every Serve
call runs in a thread: a deploy blocks for seconds, and the coordinator's loop must keep serving gRPC.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from mship.common.v1 import common_pb2
from services.coordinator.fingerprint import APP_PREFIX


@dataclass
class AppState:
    status: str  # DEPLOYING | RUNNING | DEPLOY_FAILED | DELETING | UNHEALTHY | NOT_STARTED
    message: str
    running_replicas: int
    target_replicas: int = 0


@dataclass
class NodeState:
    node_id: str
    name: str
    address: str
    alive: bool
    is_head: bool
    resources: dict[str, float]


ModelApps = dict[str, tuple[common_pb2.ModelSpec, str]]  # Serve app name -> (spec, version)


class ServeControl(Protocol):
    """The operations on Serve's model apps that deploying, rescaling and recovery need."""

    async def model_apps(self) -> dict[str, AppState]:
        """Every model app Serve runs (by app name), with its status and replica counts."""
        ...

    async def submit(self, apps: ModelApps, coordinator: str) -> None:
        """Start model apps (replicas register with `coordinator`), without waiting for them to run."""
        ...

    async def rescale(self, name: str, replicas: int) -> None:
        """Set a running app's fixed replica count in place (running replicas stay)."""
        ...

    async def delete(self, name: str) -> None:
        """Delete an app with its replicas, waiting until they are gone."""
        ...

    async def wait_app(self, name: str, timeout_s: float) -> AppState:
        """Wait until the app runs or failed; a missing app or a timeout count as failed."""
        ...

    async def nodes(self) -> list[NodeState]:
        """The cluster's nodes (alive and recently dead) with their total resources."""
        ...

    async def wake(self, name: str) -> None:
        """Start a replica of an app autoscaled to zero; returns once one serves."""
        ...


def _apps() -> dict[str, AppState]:
    from ray.serve.context import _get_global_client

    out = {}
    # The details (not serve.status()) carry each deployment's target replica count.
    details = _get_global_client().get_serve_details()
    for name, app in details.get("applications", {}).items():
        if not name.startswith(APP_PREFIX):
            continue
        deployments = app.get("deployments", {}).values()
        messages = [app.get("message", "")] + [d.get("message", "") for d in deployments]
        running = sum(1 for d in deployments for r in d.get("replicas", []) if _value(r.get("state")) == "RUNNING")
        target = sum(d.get("target_num_replicas", 0) for d in deployments)
        out[name] = AppState(_value(app.get("status")), "; ".join(m for m in messages if m), running, target)
    return out


def _nodes() -> list[NodeState]:
    import ray

    return [NodeState(n["NodeID"], n.get("NodeName", ""), n.get("NodeManagerAddress", ""), bool(n.get("Alive")),
                      "node:__internal_head__" in n.get("Resources", {}), dict(n.get("Resources", {})))
            for n in ray.nodes()]


def _value(enum_or_str: object) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str) or "")


class RayServeControl:
    """`ServeControl` on the Ray Serve this process is connected to."""

    async def model_apps(self) -> dict[str, AppState]:
        return await asyncio.to_thread(_apps)

    async def nodes(self) -> list[NodeState]:
        return await asyncio.to_thread(_nodes)

    async def submit(self, apps: ModelApps, coordinator: str) -> None:
        """Submit model apps (name -> (spec, version)) without waiting for them to run."""
        from ray import serve

        from services.worker.deployment import worker_app

        # A fixed replica count is set through the external-scaler API, so a later rescale changes the
        # live deployment in place; Serve allows that only for apps without its own autoscaling.
        targets = [serve.RunTarget(target=worker_app(spec, version, coordinator), name=name, route_prefix=None,
                                   external_scaler_enabled=not spec.HasField("autoscaling"))
                   for name, (spec, version) in apps.items()]
        await asyncio.to_thread(serve.run_many, targets, wait_for_applications_running=False)

    async def rescale(self, name: str, replicas: int) -> None:
        """Change a running app's replica count in place: running replicas stay, none reloads."""
        import ray
        from ray.serve._private.common import DeploymentID
        from ray.serve.context import _get_global_client

        controller = _get_global_client()._controller  # the only route to update_deployment_replicas in 2.60
        await asyncio.to_thread(ray.get, controller.update_deployment_replicas.remote(
            DeploymentID(name="worker", app_name=name), replicas))

    async def wake(self, name: str) -> None:
        """A handle call that waits for a replica: Serve's autoscaler counts it and scales the app
        from zero at once (its cold-start path); the call itself returns once a replica runs."""
        from ray import serve

        handle = await asyncio.to_thread(serve.get_deployment_handle, "worker", name)
        await handle.wake.remote()

    async def delete(self, name: str) -> None:
        from ray import serve

        await asyncio.to_thread(serve.delete, name, True)

    async def wait_app(self, name: str, timeout_s: float, poll_s: float = 0.5) -> AppState:
        """Poll until the app is RUNNING or failed; a missing app or a timeout count as failed."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = (await self.model_apps()).get(name)
            if state is None:
                return AppState("DEPLOY_FAILED", "the application disappeared", 0)
            if state.status in ("RUNNING", "DEPLOY_FAILED", "UNHEALTHY"):
                return state
            if time.monotonic() > deadline:
                return AppState("DEPLOY_FAILED", f"not ready within {timeout_s:.0f}s; last: {state.message}", 0)
            await asyncio.sleep(poll_s)
