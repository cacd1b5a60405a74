"""The `mship` command line: starts the platform and talks gRPC to the coordinator.

Exit codes: 0 ok · 2 bad config or usage · 3 coordinator (or head) unreachable · 4 deploy failed ·
5 the platform (or node) failed to start · 6 the token was refused.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import threading
import time
from typing import Any

import grpc

from clients import node_commands, status
from clients.env_file import load_env_file
from clients.modelset import ConfigError, load_model_set, parse_model
from clients.node_commands import (
    EXIT_BAD_CONFIG,
    EXIT_DEPLOY_FAILED,
    EXIT_OK,
    EXIT_START_FAILED,
    EXIT_UNAUTHENTICATED,
    EXIT_UNREACHABLE,
)
from mship.common.v1 import common_pb2
from mship.coordinator.v1 import coordinator_pb2 as pb
from mship.coordinator.v1 import coordinator_pb2_grpc
from services.common.channels import sync_channel
from services.common.vocabulary import ENV_COORDINATOR, ENV_RAY_AUTH_TOKEN, LOADERS

DEFAULT_COORDINATOR = "127.0.0.1:50051"
STOP_MARGIN_S = 15.0  # `mship stop` waits the platform's --stop-timeout and this: its forced path, its exit
STATE_NAMES = {v: k.removeprefix("DEPLOY_STATE_").lower() for k, v in pb.DeployState.items()}
PHASE_NAMES = {v: k.removeprefix("MODEL_PHASE_").lower() for k, v in pb.ModelPhase.items()}


def _models_from_args(args: argparse.Namespace) -> list[common_pb2.ModelSpec]:
    """--config FILE, or --model REF [--name ...] flags; ConfigError names what is wrong."""
    if args.config and args.model:
        raise ConfigError("(command line)", "--model", "--config and --model exclude each other", "pass one of them")
    if args.config:
        return load_model_set(args.config)
    if not args.model:
        return []
    entry = {"name": args.name or args.model.removeprefix("builtin:"), "model": args.model, "loader": args.loader}
    for key in ("max_model_len", "num_replicas", "num_cpus"):
        if getattr(args, key) is not None:
            entry[key] = getattr(args, key)
    return [parse_model(entry, "(command line)", "--model")]


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, coordinator_pb2_grpc.CoordinatorStub]:
    channel = sync_channel(args.coordinator)  # carries MSHIP_RAY_AUTH_TOKEN when it is set
    return channel, coordinator_pb2_grpc.CoordinatorStub(channel)


def _rpc_failure(args: argparse.Namespace, err: grpc.RpcError) -> int:
    """An unreachable coordinator or a refused token, said plainly; None for anything else."""
    if err.code() == grpc.StatusCode.UNAUTHENTICATED:
        given = "a wrong token" if os.environ.get(ENV_RAY_AUTH_TOKEN) else "no token"
        print(f"mship: the coordinator at {args.coordinator} refused the call: {given} "
              f"(set {ENV_RAY_AUTH_TOKEN} to the cluster token, in the environment or --env-file)", file=sys.stderr)
        return EXIT_UNAUTHENTICATED
    print(f"mship: cannot reach the coordinator at {args.coordinator} ({err.code().name}); "
          "is `mship start` running? (--coordinator / MSHIP_COORDINATOR)", file=sys.stderr)
    return EXIT_UNREACHABLE


def follow_deploy(events, out=sys.stdout) -> int:
    """Print deploy progress; the exit code says how it ended."""
    final = pb.DEPLOY_STATE_UNSPECIFIED
    for event in events:
        if event.HasField("model"):
            m = event.model
            line = f"  {m.name:<24} {PHASE_NAMES[m.phase]:<10} version {m.version}"
            print(line + (f": {m.reason}" if m.reason else ""), file=out, flush=True)
        elif event.message:
            print(f"deploy {event.deploy_id}: {STATE_NAMES[event.state]} ({event.message})", file=out, flush=True)
        final = event.state
    return EXIT_OK if final == pb.DEPLOY_STATE_SUCCEEDED else EXIT_DEPLOY_FAILED


def deploy(args: argparse.Namespace, stub: coordinator_pb2_grpc.CoordinatorStub,
           models: list[common_pb2.ModelSpec]) -> int:
    mode = pb.DEPLOY_MODE_RECONCILE if args.reconcile else pb.DEPLOY_MODE_ADDITIVE
    request = pb.DeployRequest(models=models, mode=mode, use_committed=args.reconcile and not models,
                               drain_timeout_s=getattr(args, "drain_timeout", None) or 0.0,
                               supersede=getattr(args, "supersede", False))
    stream = stub.Deploy(request, wait_for_ready=False)
    if args.wait:
        first = None
        with StopFollowing(stream) as stop:
            try:
                events = iter(stream)
                first = next(events)
                return follow_deploy(itertools.chain([first], events))
            except grpc.RpcError:
                if stop.signum is None:
                    raise
        where = f" (mship deploy --status {first.deploy_id})" if first else ""
        print(f"stopped following; the deploy continues{where}", file=sys.stderr)
        # SIGTERM is a supervisor's (a Kubernetes Job's pod evicted): not a finished deploy, and a
        # retry re-attaches (exit 3, as for an unreachable coordinator); Ctrl-C is a person's choice
        return EXIT_UNREACHABLE if stop.signum == signal.SIGTERM else EXIT_OK
    first = next(iter(stream))
    stream.cancel()
    print(f"deploy {first.deploy_id} started" + (f" ({first.message})" if first.message else "") +
          f"; follow it with: mship deploy --status {first.deploy_id}")
    return EXIT_OK


class StopFollowing:
    """SIGINT or SIGTERM while following a deploy stops following, never the deploy. The handler
    only cancels the stream, from a thread of its own, and the main thread sees the cancelled
    stream. An exception raised from a handler lands wherever the main thread is; inside gRPC's
    wait on its stream's lock it could leave the CLI hanging, never exiting."""

    def __init__(self, stream: grpc.Future) -> None:
        self.stream, self.signum = stream, None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopFollowing:
        self.previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *_: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signum = signum
        threading.Thread(target=self.stream.cancel, daemon=True).start()


def cmd_deploy(args: argparse.Namespace) -> int:
    models = _models_from_args(args)
    if not models and not args.reconcile and not (args.cancel or args.status):
        print("mship: nothing to deploy: pass --config FILE or --model REF", file=sys.stderr)
        return EXIT_BAD_CONFIG
    channel, stub = _stub(args)
    try:
        if args.cancel or args.status:
            request_id = args.cancel or args.status
            d = (stub.CancelDeploy(pb.CancelDeployRequest(deploy_id=request_id)) if args.cancel
                 else stub.GetDeployment(pb.GetDeploymentRequest(deploy_id=request_id)))
            print(f"deploy {d.deploy_id}: {STATE_NAMES[d.state]}" + (f" ({d.error})" if d.error else ""))
            for m in d.models:
                print(f"  {m.name:<24} {PHASE_NAMES[m.phase]:<10} version {m.version} {m.reason}")
            return EXIT_OK
        return deploy(args, stub, models)
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.UNAUTHENTICATED):
            return _rpc_failure(args, e)
        print(f"mship: {e.details()}", file=sys.stderr)
        return EXIT_BAD_CONFIG if e.code() == grpc.StatusCode.INVALID_ARGUMENT else EXIT_DEPLOY_FAILED
    finally:
        channel.close()


def cmd_models(args: argparse.Namespace, verbose: bool = False) -> int:
    channel, stub = _stub(args)
    try:
        reply = stub.ListModels(pb.ListModelsRequest(include_serve_apps=verbose), timeout=10)
        snapshot = _routing_snapshot(stub) if verbose else pb.RoutingSnapshot()
    except grpc.RpcError as e:
        return _rpc_failure(args, e)
    finally:
        channel.close()
    if verbose:
        print(f"coordinator {args.coordinator} (serving) · routing version {reply.routing_version}")
    routes = {m.name: m for m in snapshot.models}
    for m in reply.models:
        loader = common_pb2.Loader.Name(m.spec.loader).removeprefix("LOADER_").lower()
        line = f"{m.spec.name:<24} {m.spec.model:<32} {loader:<10} replicas {m.ready_replicas}"
        print(line + (f"  version {m.version}  app {m.app_name}  load {m.load_time_s:.1f}s" if verbose else ""))
        for r in routes[m.spec.name].replicas if m.spec.name in routes else []:
            endpoint = f"{r.endpoint.host}:{r.endpoint.port}"
            print(f"    replica {r.replica_id:<12} {endpoint}  pid {r.pid}  node {r.node_id[:12]}  "
                  f"engine load {r.engine_load_s:.1f}s")
    for name in snapshot.pending:
        print(f"{name:<24} (pending: no live replica)")
    if verbose and reply.apps:
        print("serve applications:")
        for app in reply.apps:
            print(f"  {app.name:<40} {app.status:<14} replicas {app.running_replicas}/{app.target_replicas}")
    return EXIT_OK


def _routing_snapshot(stub: coordinator_pb2_grpc.CoordinatorStub) -> pb.RoutingSnapshot:
    stream = stub.WatchRouting(pb.WatchRoutingRequest(subscriber_id="mship-cli"), timeout=10)
    try:
        return next(stream).snapshot
    finally:
        stream.cancel()


def cmd_start(args: argparse.Namespace) -> int:
    models = _models_from_args(args)  # a bad config fails before anything starts

    def deploy_initial(args: argparse.Namespace) -> int:
        # --config: exactly that file; --model: add it; neither: the committed set the state holds.
        args.wait, args.reconcile = True, args.config is not None or not models
        channel, stub = _stub(args)
        with channel:
            return deploy(args, stub, models)

    return node_commands.cmd_start(args, deploy_initial, [m.name for m in models])


def cmd_status(args: argparse.Namespace) -> int:
    if not args.json:
        code = cmd_models(args, verbose=True)
        if code != EXIT_OK:
            return code
    channel, stub = _stub(args)
    try:
        reply = stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=10)
    except grpc.RpcError as e:
        return _rpc_failure(args, e)
    finally:
        channel.close()
    print(status.dumps(reply) if args.json else "\n".join(status.status_text(reply)))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """SIGTERM the running `mship start`, then wait for it, bounded: as long as its own stop may take
    (its --stop-timeout, from the pidfile) and a margin, or --timeout. Never hangs."""
    pid = node_commands.pidfile(args.coordinator)
    try:
        target, its_timeout = node_commands.read_pidfile(pid)
        os.kill(target, signal.SIGTERM)  # a second `mship stop` is a second signal: it forces the stop
    except (OSError, ValueError):
        print(f"mship: no running `mship start` found for the coordinator at {args.coordinator}", file=sys.stderr)
        return EXIT_UNREACHABLE
    wait_s = args.timeout if args.timeout is not None else \
        (its_timeout or node_commands.DEFAULT_STOP_TIMEOUT_S) + STOP_MARGIN_S
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < wait_s:
            if not _running(target):
                print(f"mship stopped ({time.monotonic() - t0:.1f}s)")
                return EXIT_OK
            time.sleep(0.2)  # polling another process's exit: it is not our child to wait on
    except KeyboardInterrupt:
        print(f"mship: stopped waiting; the platform (pid {target}) goes on stopping", file=sys.stderr)
        return EXIT_START_FAILED
    print(f"mship: the platform (pid {target}) is still stopping after {wait_s:g}s; `mship stop` again forces "
          "it (what has not stopped is killed)", file=sys.stderr)
    return EXIT_START_FAILED


def _running(pid: int) -> bool:
    """Alive and not a zombie: an exited `mship start` stays in the process table until its
    parent (a supervisor, a test) reaps it, and has stopped all the same."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a models.yaml")
    p.add_argument("--model", help="builtin:NAME, a Hugging Face id or a local path")
    p.add_argument("--name", help="the OpenAI model id (default: from --model)")
    p.add_argument("--loader", choices=sorted(LOADERS), default="vllm")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--num-replicas", type=int)
    p.add_argument("--num-cpus", type=float)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mship", description="Serve many models behind one OpenAI endpoint.")
    p.add_argument("--coordinator", default=os.environ.get(ENV_COORDINATOR, DEFAULT_COORDINATOR))
    # On every subcommand too (`mship deploy --coordinator H:P`); given there, it wins.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--coordinator", default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help=f"the coordinator (default {DEFAULT_COORDINATOR}, or {ENV_COORDINATOR})")
    common.add_argument("--env-file", metavar="FILE", help=f"KEY=VALUE lines to load first (e.g. {ENV_RAY_AUTH_TOKEN})")
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", parents=[common], help="start the platform (a head) here, in the foreground")
    _model_flags(start)
    node_commands.add_start_flags(start)
    join = sub.add_parser("join", parents=[common], help="join this machine to a head's cluster, in the foreground")
    node_commands.add_join_flags(join)
    dep = sub.add_parser("deploy", parents=[common], help="apply a model set")
    _model_flags(dep)
    dep.add_argument("--reconcile", action="store_true", help="make the running set exactly this one")
    dep.add_argument("--wait", action="store_true", help="follow the deploy to its end")
    dep.add_argument("--drain-timeout", type=float, metavar="S",
                     help="how long an old version may finish its in-flight requests (default 30)")
    dep.add_argument("--supersede", action="store_true",
                     help="cancel a running or queued deploy (it goes back) instead of queueing behind it")
    dep.add_argument("--cancel", metavar="ID", help="cancel a deploy: the platform goes back to the set before it")
    dep.add_argument("--status", metavar="ID")
    st = sub.add_parser("status", parents=[common], help="nodes, models, replicas, versions, what is pending")
    st.add_argument("--json", action="store_true", help="machine-readable (stable keys: docs/multi-node.md)")
    sub.add_parser("models", parents=[common], help="the served models")
    stop = sub.add_parser("stop", parents=[common], help="stop a running `mship start`")
    stop.add_argument("--timeout", type=float, metavar="S", help="how long to wait for it to end (default: its "
                      f"--stop-timeout + {STOP_MARGIN_S:g}s); then exit 5, saying it is still stopping")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    handlers = {"start": cmd_start, "join": node_commands.cmd_join, "deploy": cmd_deploy, "models": cmd_models,
                "status": cmd_status, "stop": cmd_stop}
    try:
        load_env_file(args.env_file)
        code = handlers[args.command](args)
    except ConfigError as e:  # raised before anything was started or sent
        print(f"mship: {e}", file=sys.stderr)
        code = EXIT_BAD_CONFIG
    sys.exit(code)


if __name__ == "__main__":
    main()
