"""Options shared by the Serve deployments whose replicas serve their own gRPC or HTTP traffic."""

from __future__ import annotations

# User code on the replica's main loop, the one Serve's own gRPC server polls from. gRPC's asyncio
# layer wakes every loop in the process that uses gRPC for every event: with our servers on Serve's
# separate user-code loop, each streamed token woke two threads and crossed between them (GIL
# hand-offs), which cost latency and CPU on the token path.
ONE_LOOP_RUNTIME_ENV = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}
