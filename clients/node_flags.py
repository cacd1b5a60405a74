"""What `mship start` and `mship join` flags (and the environment they hand the replicas) become,
each checked before anything starts: a bad value fails the command with the flag to fix, not a
replica or `ray start` later."""

from __future__ import annotations

import argparse
import re

from clients.modelset import ConfigError
from services.common.vocabulary import (
    ENV_FORWARDED_ALLOW_IPS,
    ENV_MAX_CONNECTIONS,
    ENV_STATE_RETENTION_S,
    ENV_STREAM_DRAIN_S,
    forwarded_allow_ips,
    max_connections,
    state_retention_s,
    stream_drain_s,
)


def replica_settings() -> None:
    """The settings every replica reads from the environment `mship start` hands it, checked here:
    a bad one would otherwise fail each replica as it starts."""
    for name, read, hint in ((ENV_STREAM_DRAIN_S, stream_drain_s, "unset it, or give seconds >= 0"),
                             (ENV_STATE_RETENTION_S, state_retention_s, "unset it, or give seconds >= 0"),
                             (ENV_MAX_CONNECTIONS, max_connections, "unset it, or give a whole number >= 0"),
                             (ENV_FORWARDED_ALLOW_IPS, forwarded_allow_ips,
                              "give addresses or networks, comma-separated, e.g. 10.0.0.0/8,127.0.0.1")):
        try:
            read()
        except ValueError as e:
            raise ConfigError("(environment)", name, str(e).removeprefix(f"{name}="), hint) from None  # named once


def port(value: int | None, flag: str, zero_ok: bool = False) -> None:
    """A port flag in range: out of it, a socket call would fail late with an OverflowError."""
    if value is not None and not (0 if zero_ok else 1) <= value <= 65535:
        raise ConfigError("(command line)", flag, f"{value} is not a port", f"pass {0 if zero_ok else 1}-65535")


def start_addresses(args: argparse.Namespace) -> None:
    """The addresses and ports `mship start` binds and advertises, checked before anything starts."""
    for flag in ("--coordinator-port", "--state-port", "--gcs-port"):  # dialled by others: never 0
        port(getattr(args, flag[2:].replace("-", "_")), flag)
    port(args.http_port, "--http-port", zero_ok=True)
    for flag, value in (("--host", args.host), ("--advertise-address", args.advertise_address)):
        if value and ":" in value:  # bound and advertised as `host:port`, unbracketed: no IPv6 survives that
            raise ConfigError("(command line)", flag, f"{value} is an IPv6 address; the platform binds and "
                              "advertises IPv4 only", "pass 127.0.0.1, 0.0.0.0 or an IPv4 address of this machine")


def gateway_scaling(args: argparse.Namespace) -> dict:
    """PlatformConfig's gateway fields from the flags, checked."""
    low, high, target = args.gateway_min_replicas, args.gateway_max_replicas, args.gateway_target_ongoing_requests
    fixed = args.gateway_replicas
    if low is None and high is None:
        if fixed is not None and fixed < 1:
            raise ConfigError("(command line)", "--gateway-replicas", "must be at least 1", "pass 1 or more")
        return {"gateway_replicas": fixed or 1}
    if fixed is not None:
        raise ConfigError("(command line)", "--gateway-replicas", "a fixed count excludes --gateway-min-replicas / "
                          "--gateway-max-replicas", "keep one of them")
    low = 1 if low is None else low
    high = max(low, 1) if high is None else high
    if low < 1:
        raise ConfigError("(command line)", "--gateway-min-replicas", "must be at least 1 (a gateway at zero "
                          "replicas could not take the request that wakes it)", "pass 1 or more")
    if high < low:
        raise ConfigError("(command line)", "--gateway-max-replicas", f"{high} is below --gateway-min-replicas {low}",
                          "pass a maximum at least the minimum")
    if target <= 0:
        raise ConfigError("(command line)", "--gateway-target-ongoing-requests", "must be above 0", "pass e.g. 64")
    return {"gateway_replicas": low, "gateway_min_replicas": low, "gateway_max_replicas": high,
            "gateway_target_ongoing_requests": target}


def head_node_flags(args: argparse.Namespace) -> dict:
    """PlatformConfig's head-node fields: what the head offers Ray, and its monitor. Refused under
    --ray-address: the platform starts no Ray node there to apply them to."""
    given = [f for f, on in (("--node-num-cpus", args.node_num_cpus is not None), ("--node-memory", args.node_memory),
                             ("--no-ray-monitor", args.no_ray_monitor)) if on]
    if args.ray_address and given:
        raise ConfigError("(command line)", given[0], "--ray-address attaches to a Ray cluster started elsewhere",
                          f"drop {given[0]}, or --ray-address")
    return {"num_cpus": whole_cpus(args.node_num_cpus, minimum=1) or 0,  # the head's own services need CPUs
            "memory": parse_memory(args.node_memory), "ray_monitor": not args.no_ray_monitor}


def whole_cpus(value: float | None, minimum: int) -> int | None:
    """--node-num-cpus: `ray start --num-cpus` takes a whole number only, and would refuse 2.5 late."""
    if value is not None and not (value.is_integer() and value >= minimum):  # nan and inf are not integers
        raise ConfigError("(command line)", "--node-num-cpus", f"{value:g} is not a whole number of CPUs >= "
                          f"{minimum}", f"pass e.g. {max(minimum, 4)} (Ray counts logical CPUs in whole units)")
    return None if value is None else int(value)


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?$", re.IGNORECASE)


def parse_memory(text: str | None) -> int | None:
    """--node-memory (`start` and `join`): bytes, or a size such as 8GiB / 512M; None: Ray's own count."""
    if not text:
        return None
    m = _SIZE.match(text.strip())
    if m is None:
        raise ConfigError("(command line)", "--node-memory", f"not a size: {text!r}", "pass bytes or e.g. 8GiB")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(unit or " "))
