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
import psutil

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
from services.cluster.pidfile import pidfile, read_pidfile, release_pidfile, running_start
from services.cluster.shutdown import alive
from services.common.channels import sync_channel
from services.common.vocabulary import ENV_COORDINATOR, ENV_RAY_AUTH_TOKEN, LOADERS

DEFAULT_COORDINATOR = "127.0.0.1:50051"
STOP_MARGIN_S = 15.0  # `mship stop` waits the platform's --stop-timeout and this: its forced path, its exit
ANSWER_TIMEOUT_S = 10.0  # `deploy --status`, and a deploy not followed: the coordinator answers at once
CANCEL_TIMEOUT_S = 150.0  # `deploy --cancel`: the coordinator waits up to 120 s for the deploy to go back
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
    """Send the deploy; with args.wait follow it to its end. There SIGINT/SIGTERM stop following,
    not the deploy (StopFollowing), unless args.stop_following is False: the caller's handlers decide."""
    mode = pb.DEPLOY_MODE_RECONCILE if args.reconcile else pb.DEPLOY_MODE_ADDITIVE
    request = pb.DeployRequest(models=models, mode=mode, use_committed=args.reconcile and not models,
                               supersede=getattr(args, "supersede", False))
    # Unset: the coordinator's default; 0 is no drain. ConfigError before anything is sent.
    if (drain := node_commands.drain_seconds(getattr(args, "drain_timeout", None))) is not None:
        request.drain_timeout_s = drain
    # Not followed (no --wait): only its first event is waited for, which the coordinator sends at once.
    stream = stub.Deploy(request, wait_for_ready=False, timeout=None if args.wait else ANSWER_TIMEOUT_S)
    if args.wait and not getattr(args, "stop_following", True):
        try:
            return follow_deploy(stream)
        finally:  # ended by the caller's signal (an exception raised inside the wait): the call ends too
            stream.cancel()
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
    with StopFollowing(stream) as stop:
        try:
            first = next(iter(stream))
        except grpc.RpcError:
            if stop.signum is None:
                raise
            print(f"mship: stopped waiting{_goes_on(args)}", file=sys.stderr)
            return EXIT_UNREACHABLE if stop.signum == signal.SIGTERM else EXIT_OK
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
            d = (stub.CancelDeploy(pb.CancelDeployRequest(deploy_id=request_id), timeout=CANCEL_TIMEOUT_S)
                 if args.cancel else
                 stub.GetDeployment(pb.GetDeploymentRequest(deploy_id=request_id), timeout=ANSWER_TIMEOUT_S))
            print(f"deploy {d.deploy_id}: {STATE_NAMES[d.state]}" + (f" ({d.error})" if d.error else ""))
            for m in d.models:
                print(f"  {m.name:<24} {PHASE_NAMES[m.phase]:<10} version {m.version} {m.reason}")
            return EXIT_OK
        return deploy(args, stub, models)
    except KeyboardInterrupt:  # Ctrl-C in --status/--cancel's blocking call (raised between gRPC's waits,
        # nothing held), or before a deploy stream's StopFollowing is in place
        print(f"mship: stopped waiting{_goes_on(args)}", file=sys.stderr)
        return EXIT_OK
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not args.wait:  # (--wait has no deadline)
            waited = CANCEL_TIMEOUT_S if args.cancel else ANSWER_TIMEOUT_S
            print(f"mship: the coordinator at {args.coordinator} did not answer within {waited:g}s{_goes_on(args)}",
                  file=sys.stderr)
            return EXIT_UNREACHABLE
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.UNAUTHENTICATED):
            return _rpc_failure(args, e)
        print(f"mship: {e.details()}", file=sys.stderr)
        return EXIT_BAD_CONFIG if e.code() == grpc.StatusCode.INVALID_ARGUMENT else EXIT_DEPLOY_FAILED
    finally:
        channel.close()


def _goes_on(args: argparse.Namespace) -> str:
    """What a `mship deploy` that stopped waiting for the coordinator's answer leaves going on."""
    if args.cancel:
        return f"; a cancel the coordinator received goes on (mship deploy --status {args.cancel})"
    return "" if args.status else "; a deploy the coordinator received goes on (see `mship status`)"


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

    def deploy_initial(args: argparse.Namespace) -> str | None:
        """None once the start set is deployed, else why not. Followed under `mship start`'s own
        signal handlers: SIGINT/SIGTERM stop the platform, not only the following."""
        # --config: exactly that file; --model: add it; neither: the committed set the state holds.
        args.wait, args.reconcile = True, args.config is not None or not models
        args.stop_following = False
        channel, stub = _stub(args)
        with channel:
            try:
                code = deploy(args, stub, models)
            except grpc.RpcError as e:  # e.g. the coordinator replica restarted (by Serve) mid-load
                return (f"the coordinator's deploy stream ended: {e.code().name}" +
                        (f": {e.details()}" if e.details() else "") + "; see `mship status`")
        return None if code == EXIT_OK else "the lines above say why"

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
    path = pidfile(args.coordinator)
    try:
        record = read_pidfile(path)
    except (OSError, ValueError) as e:
        if not isinstance(e, FileNotFoundError) and path.exists():  # empty or garbled: no process to name
            path.unlink(missing_ok=True)
            print(f"mship: removed the unreadable pidfile {path} ({e})", file=sys.stderr)
        print(f"mship: no running `mship start` found for the coordinator at {args.coordinator}", file=sys.stderr)
        return EXIT_UNREACHABLE
    # None: the start that wrote it ended without removing it (SIGKILL, OOM, a host crash), and its
    # pid may be another process's now, which must not be signalled.
    target = running_start(record)
    try:
        if target is not None:
            target.send_signal(signal.SIGTERM)  # a second `mship stop` is a second signal: it forces the stop
    except psutil.Error:  # (psutil checks the pid is still that process's)
        target = None
    if target is None:
        release_pidfile(path, record)
        print(f"mship: the pidfile {path} is stale (pid {record.pid} is no longer the `mship start` that "
              f"wrote it); removed it. No running `mship start` found for the coordinator at {args.coordinator}",
              file=sys.stderr)
        return EXIT_UNREACHABLE
    wait_s = args.timeout if args.timeout is not None else \
        (record.stop_timeout_s or node_commands.DEFAULT_STOP_TIMEOUT_S) + STOP_MARGIN_S
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < wait_s:
            if not (target.is_running() and alive(target)):  # gone, or its pid already another's
                print(f"mship stopped ({time.monotonic() - t0:.1f}s)")
                return EXIT_OK
            time.sleep(0.2)  # polling another process's exit: it is not our child to wait on
    except KeyboardInterrupt:
        print(f"mship: stopped waiting; the platform (pid {target.pid}) goes on stopping", file=sys.stderr)
        return EXIT_START_FAILED
    print(f"mship: the platform (pid {target.pid}) is still stopping after {wait_s:g}s; `mship stop` again forces "
          "it (what has not stopped is killed)", file=sys.stderr)
    return EXIT_START_FAILED


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
    # None: not given; main() then reads MSHIP_COORDINATOR, after --env-file has been loaded.
    p.add_argument("--coordinator", metavar="HOST:PORT")
    # On every subcommand too (`mship deploy --coordinator H:P`); given there, it wins.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--coordinator", default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help=f"the coordinator (default {DEFAULT_COORDINATOR}, or {ENV_COORDINATOR})")
    common.add_argument("--env-file", metavar="FILE", help=f"KEY=VALUE lines to load first (e.g. {ENV_RAY_AUTH_TOKEN})")
    # `start` serves the coordinator (--coordinator-port), `join` needs none: --coordinator is refused
    # there (in main), not listed.
    node = argparse.ArgumentParser(add_help=False)
    node.add_argument("--coordinator", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    node.add_argument("--env-file", metavar="FILE", help=f"KEY=VALUE lines to load first (e.g. {ENV_RAY_AUTH_TOKEN})")
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", parents=[node], help="start the platform (a head) here, in the foreground")
    _model_flags(start)
    node_commands.add_start_flags(start)
    join = sub.add_parser("join", parents=[node], help="join this machine to a head's cluster, in the foreground")
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
        if args.command in ("start", "join") and args.coordinator is not None:
            problem, fix = (("`mship start` runs the coordinator; it listens on --host:--coordinator-port",
                             "pass --coordinator-port PORT (and --host ADDR) instead") if args.command == "start" else
                            ("`mship join` talks to the head's Ray GCS, not to a coordinator",
                             "drop it; --gcs-address HOST:PORT names the head"))
            raise ConfigError("(command line)", "--coordinator", problem, fix)
        load_env_file(args.env_file)
        if args.coordinator is None:  # the environment, --env-file included, then the default
            args.coordinator = os.environ.get(ENV_COORDINATOR) or DEFAULT_COORDINATOR
        code = handlers[args.command](args)
    except ConfigError as e:  # raised before anything was started or sent
        print(f"mship: {e}", file=sys.stderr)
        code = EXIT_BAD_CONFIG
    sys.exit(code)


if __name__ == "__main__":
    main()
