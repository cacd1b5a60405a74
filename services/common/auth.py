"""The platform token on gRPC: servers require it (`TokenAuthInterceptor` in interceptors.py),
every client of the platform sends it (channels.py).

With `MSHIP_RAY_AUTH_TOKEN` set (the cluster token, the same one Ray checks), every mship server
refuses a call without `authorization: Bearer <token>` as UNAUTHENTICATED, except grpc.health.v1
(probes carry no secrets). Unset, nothing is checked or sent: a single-node platform on loopback.
The check is one server interceptor and the sending one client interceptor per channel, never
code in a method.
"""

from __future__ import annotations

import os

from services.common.vocabulary import ENV_RAY_AUTH_TOKEN

HEALTH_PREFIX = "/grpc.health.v1.Health/"
UNAUTHENTICATED_MESSAGE = (f"missing or wrong platform token: send `authorization: Bearer <token>` with the "
                           f"cluster's {ENV_RAY_AUTH_TOKEN}")


def platform_token() -> str | None:
    """The cluster token of this process's node, or None when auth is off."""
    return os.environ.get(ENV_RAY_AUTH_TOKEN) or None


def bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")
