"""`mship start` (the head: Ray head node, Serve, the platform's services) and `mship join` (a
node joining the head's Ray cluster), both in the foreground; SIGINT/SIGTERM ends what they started.

Token rules, the same for both: the cluster token comes from MSHIP_RAY_AUTH_TOKEN (environment or
--env-file), never from a flag; `start` refuses a token without --enable-ray-auth and the reverse.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
import time

from clients.modelset import ConfigError
from clients.node_flags import (
    gateway_scaling,
    head_node_flags,
    parse_memory,
    port,
    replica_settings,
    start_addresses,
    whole_cpus,
)
from services.cluster.pidfile import claim_pidfile, pidfile, release_pidfile
from services.cluster.shutdown import SIGNAL_CHECK_S, StopDeadline, StopRequested, StopSignals
from services.cluster.telemetry import DEFAULT_METRICS_PORT
from services.common.vocabulary import ENV_RAY_AUTH_TOKEN, ENV_STATE_STORE

EXIT_OK, EXIT_BAD_CONFIG, EXIT_UNREACHABLE, EXIT_DEPLOY_FAILED, EXIT_START_FAILED, EXIT_UNAUTHENTICATED = \
    0, 2, 3, 4, 5, 6
JOIN_TIMEOUT_S = 50.0  # Ray refuses a wrong token after ~22 s; an unreachable head never answers
DEFAULT_STOP_TIMEOUT_S = 60.0  # --stop-timeout: the whole stop, drains included
NO_TOKEN = (f"set {ENV_RAY_AUTH_TOKEN} to the cluster token in the environment or in --env-file FILE "
            "(generate one with: python -c 'import secrets; print(secrets.token_hex(32))')")


def _report(deadline: StopDeadline) -> None:
    if line := deadline.summary():
        print(f"mship: {line}", file=sys.stderr, flush=True)


def _positive(value: float, flag: str) -> float:
    if not 0 < value < math.inf:  # nan included
        raise ConfigError("(command line)", flag, "must be above 0", "pass seconds, e.g. 60")
    return value


def drain_seconds(value: float | None) -> float | None:
    """A --drain-timeout (`deploy`, `join`): 0 (no drain) or more seconds; None: not given."""
    if value is not None and not 0 <= value < math.inf:  # nan included
        raise ConfigError("(command line)", "--drain-timeout", f"{value:g} is not 0 or more seconds",
                          "pass e.g. 30 (0: no drain)")
    return value


def start_token(args: argparse.Namespace) -> str | None:
    """The head's token under the rules; ConfigError when they are broken."""
    token = os.environ.get(ENV_RAY_AUTH_TOKEN) or None
    if token and not args.enable_ray_auth:
        raise ConfigError("(environment)", ENV_RAY_AUTH_TOKEN, "a cluster token is set but auth is off",
                          "pass --enable-ray-auth, or unset the token")
    if args.enable_ray_auth and not token:
        raise ConfigError("(command line)", "--enable-ray-auth", "no cluster token", NO_TOKEN)
    return token


def cmd_start(args: argparse.Namespace, deploy_initial, expected: list[str]) -> int:
    from services.cluster.capabilities import CapabilityError, node_capabilities
    from services.cluster.pidfile import PidfileHeld
    from services.cluster.ports import PortTaken, check_free, is_loopback
    from services.cluster.ray_node import NodeStartError
    from services.launcher import Platform, PlatformConfig

    token = start_token(args)
    stop_timeout = _positive(args.stop_timeout, "--stop-timeout")
    start_addresses(args)
    replica_settings()
    try:
        caps = node_capabilities() if not args.no_models_on_head else []
    except CapabilityError as e:
        raise ConfigError("(environment)", "MSHIP_NODE_CAPABILITIES", str(e), 'set a JSON list such as ["vllm"]') \
            from None
    if not token and not is_loopback(args.host):
        print(f"mship: warning: binding {args.host} without --enable-ray-auth: anyone who reaches these ports "
              "can deploy models and read stored conversations", file=sys.stderr)
    cfg = PlatformConfig(host=args.host, http_port=args.http_port, coordinator_port=args.coordinator_port,
                         state_port=args.state_port, gcs_port=args.gcs_port, **gateway_scaling(args),
                         state_store=args.state_store or os.environ.get(ENV_STATE_STORE, "memory://"),
                         ray_address=args.ray_address, advertise_address=args.advertise_address, token=token,
                         models_on_head=not args.no_models_on_head, capabilities=caps, expected_models=expected,
                         telemetry=telemetry_of(args, args.host), **head_node_flags(args))
    signals = StopSignals()
    pid, claimed = pidfile(cfg.coordinator_address), None
    platform = Platform(cfg)
    code = EXIT_START_FAILED
    try:
        check_free(cfg.ports())  # before the pidfile: a start on taken ports leaves the running one's alone
        claimed = claim_pidfile(pid, stop_timeout)  # `mship stop` waits as long as this stop may take
        code = _run_platform(platform, cfg, args, signals, deploy_initial, caps, token)
    except (PortTaken, NodeStartError, PidfileHeld) as e:
        print(f"mship: the platform failed to start: {e}", file=sys.stderr)
    except Exception as e:
        print(f"mship: the platform failed to start: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        signals.stop.set()  # from here on a signal hurries the stop
        signals.install()  # Ray's SIGTERM handler (sys.exit) may be in place after an interrupted start
        # ... and Ray's C++ failure-signal handler (absl), in front from ray.init until ours are back,
        # armed a 3 s alarm on that SIGTERM that aborts the process: the stop must not end that way.
        signal.alarm(0)
        print(f"stopping mship (up to {stop_timeout:g}s; a second Ctrl-C or SIGTERM forces it) ...", flush=True)
        deadline = platform.stop(stop_timeout, signals.hurry)
        _report(deadline)
        if claimed is not None:
            release_pidfile(pid, claimed)
        if deadline.exit_hard:  # a Ray call never returned, or Ray is half torn down: its exit hooks would hang
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _run_platform(platform, cfg, args: argparse.Namespace, signals: StopSignals, deploy_initial, caps: list[str],
                  token: str | None) -> int:
    """Start, deploy the start set, serve until a signal; a signal while starting or deploying ends
    that at once (a start or a model load can take minutes)."""
    from services.launcher import edge_access

    t0 = time.monotonic()
    try:
        with signals.interrupting():
            platform.start()
    except (StopRequested, SystemExit):  # SystemExit: Ray's own SIGTERM handler, which ray.init installs
        return EXIT_OK
    signals.install()  # ray.init installed its own handlers: ours win
    signal.signal(signal.SIGHUP, lambda *_: print(  # a reload request: nothing here needs one
        "mship: SIGHUP: the gateways re-read the API keys and rate-limits files within a second of a "
        "change; the platform keeps running", flush=True))
    if signals.stop.is_set():
        return EXIT_OK
    print(f"mship platform up in {time.monotonic() - t0:.1f}s: coordinator {cfg.coordinator_address}, "
          f"state {cfg.state_address}" + ("" if cfg.ray_address else
                                          f", Ray GCS {cfg.advertise_address}:{cfg.gcs_port}") +
          f", auth {'on' if token else 'off'}, head capabilities {caps or 'none'}", flush=True)
    if cfg.telemetry.metrics:
        print(f"metrics on :{cfg.telemetry.metrics_port}/metrics; every node's, for Prometheus file_sd: "
              f"{cfg.service_discovery_file}", flush=True)
    args.coordinator = cfg.coordinator_address
    try:
        with signals.interrupting():  # a signal while following it stops the platform, as at any other time
            failed = deploy_initial(args)
    except StopRequested:
        return EXIT_OK
    if failed:  # the platform is up: a deploy that did not succeed is one to retry, not a reason to stop
        print(f"mship: the initial deploy failed ({failed}); the platform keeps running", file=sys.stderr)
    print(f"OpenAI API at http://{cfg.host}:{cfg.http_port}/v1  (Ctrl-C or `mship stop` to stop)", flush=True)
    print(f"API access: {edge_access()}", flush=True)
    signals.wait()
    return EXIT_OK


def cmd_join(args: argparse.Namespace) -> int:
    from services.cluster.capabilities import CapabilityError, node_capabilities, node_resources, visible_gpus
    from services.cluster.ports import PortTaken, check_free, check_local, is_loopback
    from services.cluster.ray_node import NodeConfig

    stop_timeout = join_stop_timeout(args)
    num_cpus = whole_cpus(args.node_num_cpus, minimum=0)
    if args.node_num_gpus is not None and args.node_num_gpus > (seen := visible_gpus()):
        raise ConfigError("(command line)", "--node-num-gpus", f"{args.node_num_gpus} GPUs asked, this node "
                          f"sees {seen}", f"pass at most {seen}")
    try:
        caps = node_capabilities()
    except CapabilityError as e:
        raise ConfigError("(environment)", "MSHIP_NODE_CAPABILITIES", str(e), 'set a JSON list such as ["vllm"]') \
            from None
    token = os.environ.get(ENV_RAY_AUTH_TOKEN) or None
    head_host = args.gcs_address.rsplit(":", 1)[0]
    node_ip = args.advertise_address or ("127.0.0.1" if is_loopback(head_host) else None)
    telemetry = telemetry_of(args, node_ip or "0.0.0.0")
    try:  # checked before anything starts, as `mship start` checks its own
        check_local("--advertise-address", args.advertise_address)
        if telemetry.metrics:
            check_free({"--metrics-port": (telemetry.metrics_host, telemetry.metrics_port)})
    except PortTaken as e:
        print(f"mship: join failed: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    telemetry.start()
    cfg = NodeConfig(head=False, gcs_address=args.gcs_address, node_ip=node_ip, num_cpus=num_cpus,
                     num_gpus=args.node_num_gpus, memory=parse_memory(args.node_memory),
                     node_name=args.node_name or f"{socket.gethostname()}-{os.getpid()}",
                     resources=node_resources(caps, gateway=not args.no_gateway),
                     token=token, drain_timeout_s=args.drain_timeout, labels=telemetry.labels(),
                     extra_env=telemetry.env(), agent_port=telemetry.agent_port)
    signals = StopSignals()
    try:
        return _joined(args, cfg, telemetry, signals, stop_timeout, token, caps, node_ip)
    finally:
        telemetry.stop()


def _joined(args: argparse.Namespace, cfg, telemetry, signals: StopSignals, stop_timeout: float, token: str | None,
            caps: list[str], node_ip: str | None) -> int:
    from services.cluster.ray_node import NodeStartError, RayNode

    node = RayNode(cfg, echo=args.verbose)
    try:
        with signals.interrupting():  # a head that never answers takes JOIN_TIMEOUT_S to give up on
            node.wait_started(JOIN_TIMEOUT_S)
    except StopRequested:
        _leave(node, StopDeadline(stop_timeout, signals.hurry))
        return EXIT_OK
    except NodeStartError as e:
        node.stop(grace_s=5)
        hint = {"auth": f"; {NO_TOKEN}" if not token else f": is {ENV_RAY_AUTH_TOKEN} the head's token?",
                "unreachable": " (is `mship start` running there, and --gcs-port open?)"}.get(e.kind, "")
        print(f"mship: join failed: {e}{hint}", file=sys.stderr)
        return {"auth": EXIT_UNAUTHENTICATED, "unreachable": EXIT_UNREACHABLE}.get(e.kind, EXIT_START_FAILED)
    metrics = f"metrics on :{telemetry.metrics_port}" if telemetry.metrics else "no metrics"
    gateway = "no gateways" if args.no_gateway else "gateways"
    print(f"mship: joined {args.gcs_address} as node {cfg.node_name} ({node_ip or 'Ray-chosen address'}), "
          f"capabilities {caps or 'none'}, {gateway}, {metrics}; Ctrl-C or SIGTERM leaves (drain up to "
          f"{args.drain_timeout:.0f}s, all of it up to {stop_timeout:g}s)", flush=True)
    while not signals.stop.wait(SIGNAL_CHECK_S):
        if not node.running():
            print(f"mship: the Ray node exited ({node.proc.returncode}); the head may be gone", file=sys.stderr)
            node.stop(grace_s=5)
            return EXIT_START_FAILED
    t0 = time.monotonic()
    _leave(node, StopDeadline(stop_timeout, signals.hurry))
    print(f"mship: left the cluster in {time.monotonic() - t0:.1f}s", flush=True)
    return EXIT_OK


def _leave(node, deadline: StopDeadline) -> None:
    """The node's stop (Ray drains it) within the deadline; a second signal SIGKILLs it at once."""
    deadline.killed_pids += node.stop(grace_s=deadline.remaining(), hurry=deadline.hurry)
    _report(deadline)


def join_stop_timeout(args: argparse.Namespace) -> float:
    """--stop-timeout for a join: by default 60 s, or the drain and 30 s more when that is longer."""
    drain_seconds(args.drain_timeout)
    if args.stop_timeout is None:
        return max(DEFAULT_STOP_TIMEOUT_S, args.drain_timeout + 30)
    if _positive(args.stop_timeout, "--stop-timeout") < args.drain_timeout:
        raise ConfigError("(command line)", "--stop-timeout", f"{args.stop_timeout:g}s is shorter than "
                          f"--drain-timeout {args.drain_timeout:g}s", "raise --stop-timeout or lower --drain-timeout")
    return args.stop_timeout


def add_start_flags(start: argparse.ArgumentParser) -> None:
    start.add_argument("--host", default="127.0.0.1", help="what the services bind (default loopback)")
    start.add_argument("--http-port", type=int, default=8000)
    start.add_argument("--coordinator-port", type=int, default=50051)
    start.add_argument("--state-port", type=int, default=50052)
    start.add_argument("--gcs-port", type=int, default=6380, help="the head's Ray GCS port, which joiners dial")
    start.add_argument("--state-store", help="memory:// (default) or redis://host:port/db")
    start.add_argument("--gateway-replicas", type=int, metavar="N", help="a fixed number of gateway replicas "
                       "(default 1)")
    start.add_argument("--gateway-min-replicas", type=int, metavar="N",
                       help="autoscale the gateways from N replicas (default 1) ...")
    start.add_argument("--gateway-max-replicas", type=int, metavar="N", help="... up to N, on in-flight requests")
    start.add_argument("--gateway-target-ongoing-requests", type=float, default=64.0, metavar="N",
                       help="in-flight HTTP requests per gateway replica the autoscaler aims at (default 64)")
    start.add_argument("--ray-address", help="attach to a Ray cluster started elsewhere instead of "
                       "starting a head node")
    start.add_argument("--enable-ray-auth", action="store_true",
                       help=f"token auth on Ray and on the platform's gRPC (token: {ENV_RAY_AUTH_TOKEN})")
    start.add_argument("--no-models-on-head", action="store_true",
                       help="control plane and gateway only: the head advertises no engine capability")
    start.add_argument("--node-num-cpus", type=float, help="logical CPUs the head offers Ray (default: 4 per CPU "
                       "the machine reports; in a container pass its limit)")
    start.add_argument("--node-memory", help="memory the head offers Ray: bytes or e.g. 8GiB (default: Ray's count)")
    start.add_argument("--no-ray-monitor", action="store_true", help="start the Ray head without Ray's autoscaler "
                       "monitor: an external autoscaler (KubeRay's sidecar) manages this cluster")
    start.add_argument("--advertise-address", metavar="ADDR",
                       help="the private address other nodes reach this one at (default: loopback when --host is, "
                       "else the node's IP as Ray sees it)")
    start.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, metavar="S",
                       help="on SIGINT/SIGTERM: replicas drain, then what is left is killed (and named) so that the "
                       f"whole stop takes at most S seconds (default {DEFAULT_STOP_TIMEOUT_S:g})")
    add_telemetry_flags(start)


def add_telemetry_flags(p: argparse.ArgumentParser) -> None:
    """Per node: `mship start` (the head) and `mship join` take the same ones."""
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT, metavar="PORT",
                   help=f"this node's Prometheus metrics, every process of it (default {DEFAULT_METRICS_PORT})")
    p.add_argument("--no-metrics", action="store_true", help="serve no metrics on this node")
    p.add_argument("--dashboard-agent-port", type=int, metavar="PORT", help="Ray's agent on this node, whose "
                   "/api/healthz Kubernetes probes ask (default: a free port, so that nodes can share a machine)")
    p.add_argument("--otel-endpoint", metavar="HOST:PORT", help="export OpenTelemetry traces (OTLP/gRPC) there; "
                   "default: tracing off")
    p.add_argument("--log-target", metavar="URL", help="syslog://host:port (UDP) or syslog+tcp://host:port: this "
                   "node's logs go there as well (format and level: MSHIP_LOG_FORMAT, MSHIP_LOG_LEVEL)")


def telemetry_of(args: argparse.Namespace, host: str):
    """The node's NodeTelemetry from its flags, checked."""
    from services.cluster.telemetry import NodeTelemetry
    from services.common.logs import parse_log_target

    if args.log_target:
        try:
            parse_log_target(args.log_target)
        except ValueError as e:
            raise ConfigError("(command line)", "--log-target", str(e),
                              "pass syslog://host:port (UDP) or syslog+tcp://host:port") from None
    port(args.metrics_port, "--metrics-port")
    port(args.dashboard_agent_port, "--dashboard-agent-port")
    return NodeTelemetry(metrics=not args.no_metrics, metrics_host=host, metrics_port=args.metrics_port,
                         log_target=args.log_target, otel_endpoint=args.otel_endpoint,
                         agent_port=args.dashboard_agent_port)


def add_join_flags(join: argparse.ArgumentParser) -> None:
    join.add_argument("--gcs-address", required=True, metavar="HOST:PORT", help="the head's Ray GCS (--gcs-port)")
    join.add_argument("--node-num-cpus", type=float, help="logical CPUs to offer (default: Ray's count)")
    join.add_argument("--node-num-gpus", type=int, help="GPUs to offer (at most what the node sees)")
    join.add_argument("--node-memory", help="memory to offer: bytes or e.g. 8GiB")
    join.add_argument("--node-name", help="the node's name in `mship status` (default: hostname-pid)")
    join.add_argument("--advertise-address", metavar="ADDR", help="the address other nodes reach this one at")
    join.add_argument("--no-gateway", action="store_true", help="this node hosts no gateway replica")
    join.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                      help="on SIGTERM: how long Serve may move this node's replicas elsewhere")
    join.add_argument("--stop-timeout", type=float, metavar="S", help="on SIGTERM: the whole leave, drain "
                      "included, before the node's processes are killed (default 60, or --drain-timeout + 30)")
    join.add_argument("--verbose", action="store_true", help="echo Ray's own output")
    add_telemetry_flags(join)
