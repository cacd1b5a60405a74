"""The ports a platform or node binds on a machine: checked before anything starts, so a taken one
fails at once with the port and the flag that moves it, not minutes later inside a replica."""

from __future__ import annotations

import socket


class PortTaken(RuntimeError):
    pass


def check_free(ports: dict[str, tuple[str, int]]) -> None:
    """`ports`: flag -> (host, port). Raises PortTaken naming the first port in use."""
    for flag, (host, port) in ports.items():
        if port == 0:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            # As the servers bind (SO_REUSEADDR): only a listener, not a closing connection, takes it.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise PortTaken(f"port {port} on {host} is already in use ({e.strerror}); move it with {flag} "
                                "(another mship platform on this machine needs its own ports)") from None


def check_local(flag: str, address: str | None) -> None:
    """`address` (given with `flag`; None: none given) is one of this machine's: something here can
    bind it. Raises PortTaken naming it otherwise, before a Ray node would fail on it with a traceback."""
    if not address:
        return
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        try:
            s.bind((address, 0))
        except OSError as e:  # gaierror included: a name that does not resolve
            raise PortTaken(f"{address} is not an address of this machine ({e.strerror}); pass one of its own "
                            f"with {flag}") from None


def free_port(host: str) -> int:
    """A port nothing listens on now, for a Ray component co-located nodes would otherwise share."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
