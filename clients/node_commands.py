"""`mship start` (the head: Ray head node, Serve, the platform's services) and `mship join` (a
node joining the head's Ray cluster), both in the foreground; SIGINT/SIGTERM ends what they started.

Token rules, the same for both: the cluster token comes from MSHIP_RAY_AUTH_TOKEN (environment or
--env-file), never from a flag; `start` refuses a token without --enable-ray-auth and the reverse.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from clients.modelset import ConfigError
from services.common.vocabulary import (
    ENV_API_KEYS,
    ENV_API_KEYS_FILE,
    ENV_CACHE_DIR,
    ENV_RAY_AUTH_TOKEN,
    ENV_STATE_STORE,
    ENV_TRUST_IDENTITY_HEADER,
    ENV_TRUSTED_IDENTITY_HEADER,
)

EXIT_OK, EXIT_BAD_CONFIG, EXIT_UNREACHABLE, EXIT_DEPLOY_FAILED, EXIT_START_FAILED, EXIT_UNAUTHENTICATED = \
    0, 2, 3, 4, 5, 6
JOIN_TIMEOUT_S = 50.0  # Ray refuses a wrong token after ~22 s; an unreachable head never answers
NO_TOKEN = (f"set {ENV_RAY_AUTH_TOKEN} to the cluster token in the environment or in --env-file FILE "
            "(generate one with: python -c 'import secrets; print(secrets.token_hex(32))')")


def pidfile(coordinator: str) -> Path:
    """Where `mship start` leaves its pid, per coordinator port: several platforms may share a host."""
    root = Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "mship")
    return root / "run" / f"mship-start-{coordinator.rsplit(':', 1)[-1]}.pid"


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


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
    from services.cluster.ports import PortTaken, is_loopback
    from services.cluster.ray_node import NodeStartError
    from services.launcher import Platform, PlatformConfig

    token = start_token(args)
    try:
        caps = node_capabilities() if not args.no_models_on_head else []
    except CapabilityError as e:
        raise ConfigError("(environment)", "MSHIP_NODE_CAPABILITIES", str(e), 'set a JSON list such as ["vllm"]') \
            from None
    if not token and not is_loopback(args.host):
        print(f"mship: warning: binding {args.host} without --enable-ray-auth: anyone who reaches these ports "
              "can deploy models and read stored conversations", file=sys.stderr)
    cfg = PlatformConfig(host=args.host, http_port=args.http_port, coordinator_port=args.coordinator_port,
                         state_port=args.state_port, gcs_port=args.gcs_port, gateway_replicas=args.gateway_replicas,
                         state_store=args.state_store or os.environ.get(ENV_STATE_STORE, "memory://"),
                         ray_address=args.ray_address, advertise_address=args.advertise_address, token=token,
                         models_on_head=not args.no_models_on_head, capabilities=caps, expected_models=expected)
    stop = _stop_event()
    pid = pidfile(cfg.coordinator_address)
    pid.parent.mkdir(parents=True, exist_ok=True)
    pid.write_text(str(os.getpid()))
    platform = Platform(cfg)
    try:
        t0 = time.monotonic()
        platform.start()
        for sig in (signal.SIGINT, signal.SIGTERM):  # ray.init installs its own handlers: ours win
            signal.signal(sig, lambda *_: stop.set())
        signal.signal(signal.SIGHUP, lambda *_: print(  # a reload request: nothing here needs one
            "mship: SIGHUP: the gateways re-read the API keys and rate-limits files within a second of a "
            "change; the platform keeps running", flush=True))
        if stop.is_set():
            return EXIT_OK
        print(f"mship platform up in {time.monotonic() - t0:.1f}s: coordinator {cfg.coordinator_address}, "
              f"state {cfg.state_address}" + ("" if cfg.ray_address else
                                              f", Ray GCS {cfg.advertise_address}:{cfg.gcs_port}") +
              f", auth {'on' if token else 'off'}, head capabilities {caps or 'none'}", flush=True)
        args.coordinator = cfg.coordinator_address
        if deploy_initial(args) != EXIT_OK:
            print("mship: the initial deploy failed; the platform keeps running", file=sys.stderr)
        print(f"OpenAI API at http://{cfg.host}:{cfg.http_port}/v1  (Ctrl-C or `mship stop` to stop)", flush=True)
        print(f"API access: {edge_access()}", flush=True)
        stop.wait()
        return EXIT_OK
    except (PortTaken, NodeStartError) as e:
        print(f"mship: the platform failed to start: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    except Exception as e:
        print(f"mship: the platform failed to start: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    finally:
        print("stopping mship ...", flush=True)
        platform.stop()
        if pid.exists() and pid.read_text() == str(os.getpid()):
            pid.unlink()


def visible_gpus() -> int:
    """GPUs this node can use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?$", re.IGNORECASE)


def parse_memory(text: str) -> int:
    """--node-memory: bytes, or a size such as 8GiB / 512M."""
    m = _SIZE.match(text.strip())
    if m is None:
        raise ConfigError("(command line)", "--node-memory", f"not a size: {text!r}", "pass bytes or e.g. 8GiB")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(unit or " "))


def cmd_join(args: argparse.Namespace) -> int:
    from services.cluster.capabilities import CapabilityError, node_capabilities, resources
    from services.cluster.ports import is_loopback
    from services.cluster.ray_node import NodeConfig, NodeStartError, RayNode

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
    cfg = NodeConfig(head=False, gcs_address=args.gcs_address, node_ip=node_ip, num_cpus=args.node_num_cpus,
                     num_gpus=args.node_num_gpus, memory=parse_memory(args.node_memory) if args.node_memory else None,
                     node_name=args.node_name or f"{socket.gethostname()}-{os.getpid()}", resources=resources(caps),
                     token=token, drain_timeout_s=args.drain_timeout)
    stop = _stop_event()
    node = RayNode(cfg, echo=args.verbose)
    try:
        node.wait_started(JOIN_TIMEOUT_S)
    except NodeStartError as e:
        node.stop(grace_s=5)
        hint = {"auth": f"; {NO_TOKEN}" if not token else f": is {ENV_RAY_AUTH_TOKEN} the head's token?",
                "unreachable": " (is `mship start` running there, and --gcs-port open?)"}.get(e.kind, "")
        print(f"mship: join failed: {e}{hint}", file=sys.stderr)
        return {"auth": EXIT_UNAUTHENTICATED, "unreachable": EXIT_UNREACHABLE}.get(e.kind, EXIT_START_FAILED)
    print(f"mship: joined {args.gcs_address} as node {cfg.node_name} ({node_ip or 'Ray-chosen address'}), "
          f"capabilities {caps or 'none'}; Ctrl-C or SIGTERM leaves (drain up to {args.drain_timeout:.0f}s)",
          flush=True)
    while not stop.wait(0.5):
        if not node.running():
            print(f"mship: the Ray node exited ({node.proc.returncode}); the head may be gone", file=sys.stderr)
            node.stop(grace_s=5)
            return EXIT_START_FAILED
    t0 = time.monotonic()
    node.stop()
    print(f"mship: left the cluster in {time.monotonic() - t0:.1f}s", flush=True)
    return EXIT_OK


def add_start_flags(start: argparse.ArgumentParser) -> None:
    start.add_argument("--host", default="127.0.0.1", help="what the services bind (default loopback)")
    start.add_argument("--http-port", type=int, default=8000)
    start.add_argument("--coordinator-port", type=int, default=50051)
    start.add_argument("--state-port", type=int, default=50052)
    start.add_argument("--gcs-port", type=int, default=6380, help="the head's Ray GCS port, which joiners dial")
    start.add_argument("--state-store", help="memory:// (default) or redis://host:port/db")
    start.add_argument("--gateway-replicas", type=int, default=1)
    start.add_argument("--ray-address", help="attach to this Ray cluster (e.g. `auto` under KubeRay) instead of "
                       "starting a head node")
    start.add_argument("--enable-ray-auth", action="store_true",
                       help=f"token auth on Ray and on the platform's gRPC (token: {ENV_RAY_AUTH_TOKEN})")
    start.add_argument("--no-models-on-head", action="store_true",
                       help="control plane and gateway only: the head advertises no engine capability")
    start.add_argument("--advertise-address", metavar="ADDR",
                       help="the private address other nodes reach this one at (default: loopback when --host is, "
                       "else the node's IP as Ray sees it)")


def add_join_flags(join: argparse.ArgumentParser) -> None:
    join.add_argument("--gcs-address", required=True, metavar="HOST:PORT", help="the head's Ray GCS (--gcs-port)")
    join.add_argument("--node-num-cpus", type=float, help="logical CPUs to offer (default: Ray's count)")
    join.add_argument("--node-num-gpus", type=int, help="GPUs to offer (at most what the node sees)")
    join.add_argument("--node-memory", help="memory to offer: bytes or e.g. 8GiB")
    join.add_argument("--node-name", help="the node's name in `mship status` (default: hostname-pid)")
    join.add_argument("--advertise-address", metavar="ADDR", help="the address other nodes reach this one at")
    join.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                      help="on SIGTERM: how long Serve may move this node's replicas elsewhere")
    join.add_argument("--verbose", action="store_true", help="echo Ray's own output")


def edge_access() -> str:
    """Who may call the OpenAI API, as the gateways will decide it (services.gateway.identity)."""
    if os.environ.get(ENV_API_KEYS) or os.environ.get(ENV_API_KEYS_FILE):
        return "API keys required (Authorization: Bearer KEY or x-api-key)"
    if header := os.environ.get(ENV_TRUSTED_IDENTITY_HEADER) or (
            "x-mship-identity" if os.environ.get(ENV_TRUST_IDENTITY_HEADER) == "1" else ""):
        return f"the identity in the {header} header, set by the proxy in front (nothing else is accepted)"
    return (f"open: no API keys, every caller is the one anonymous identity (one prefix cache, rate limits "
            f"per client address); set {ENV_API_KEYS} or {ENV_API_KEYS_FILE} to require keys")
