"""The platform's shared vocabulary: loader, usecase and parser names, and environment variables.

Clients (CLI, models.yaml validation) and services both import this module, so a name is spelled
once and a client never imports a service's internals to learn it.
"""

from __future__ import annotations

import ipaddress
import os
import re

from mship.common.v1 import common_pb2

# models.yaml `loader:` -> the proto enum.
LOADERS = {"vllm": common_pb2.LOADER_VLLM, "llama_cpp": common_pb2.LOADER_LLAMA_CPP,
           "piper": common_pb2.LOADER_PIPER, "faster_whisper": common_pb2.LOADER_FASTER_WHISPER}
IMPLEMENTED_LOADERS = frozenset(LOADERS)  # a loader named before it runs would be left out here
# builtin models the llama_cpp loader serves as GGUF (services/worker/gguf_models.py)
GGUF_BUILTINS = ("smollm2-135m-instruct", "gemma-3-270m", "tiny-qwen2")
# models.yaml keys of the llama_cpp loader -> LlamaCppOptions fields (`embeddings: true` is
# llama.cpp's spelling of `usecase: embed`, which is what it sets)
LLAMA_CPP_KEYS = {"n_ctx": "n_ctx", "n_parallel": "n_parallel", "n_threads": "n_threads",
                  "n_gpu_layers": "n_gpu_layers", "chat_template": "chat_template",
                  "llama_server_binary": "server_binary", "llama_server_args": "server_args",
                  "llama_runtime": "runtime", "embeddings": "usecase"}
LLAMA_RUNTIMES = ("server", "in_process")  # llama-server subprocess (default) | xllamacpp in the worker
LOADER_NAMES = {value: name for name, value in LOADERS.items()}

USECASES = {"generate": common_pb2.USECASE_GENERATE, "embed": common_pb2.USECASE_EMBED,
            "speech": common_pb2.USECASE_SPEECH, "transcription": common_pb2.USECASE_TRANSCRIPTION}
# Loaders that serve exactly one usecase (the audio engines): their default, and the only one allowed.
LOADER_USECASES = {"piper": "speech", "faster_whisper": "transcription"}
# builtin models of the audio loaders (services/worker/builtin/piper_joe.py, whisper_base.py)
AUDIO_BUILTINS = {"piper": ("piper-joe",), "faster_whisper": ("whisper-base",)}

TOOL_PARSERS = ("hermes", "none")
REASONING_PARSERS = ("think", "none")


def loader_name(loader: int) -> str:
    """A ModelSpec's loader as its models.yaml name (unspecified: the default, vllm)."""
    return LOADER_NAMES.get(loader, "vllm")


# How long a replica that Serve stops while it serves (a downscale, a node drained, a replacement,
# the platform stopping) lets its in-flight streams run on: Serve picks it by node, not by what runs
# on it, and a rescale must not cut long generations. A node's drain and `mship stop`'s
# --stop-timeout bound it further; a stop with nothing in flight does not wait.
ENV_STREAM_DRAIN_S = "MSHIP_STREAM_DRAIN_S"
DEFAULT_STREAM_DRAIN_S = 300.0
DEFAULT_REPLICA_CPUS = 0.5  # what a model replica asks Ray for when its spec names no num_cpus
# A model's name (its OpenAI `model` id), as models.yaml and the coordinator accept it.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def capability_resource(loader: str) -> str:
    """The Ray custom resource a node advertises when it can run `loader`; every replica of a model
    with that loader requests it, so Ray places it only where the engine really runs."""
    return f"mship_{loader}"


# The Ray custom resource of the nodes a gateway replica may run on (the head; a joiner unless
# `--no-gateway`): each replica requests one unit, so under Kubernetes the gateways land only on the
# pods the HTTP Service selects. Not a loader name: capability listings never show it.
GATEWAY_RESOURCE = "mship_gateway"


# ---- environment variables --------------------------------------------------------------------
ENV_COORDINATOR = "MSHIP_COORDINATOR"            # the CLI's default --coordinator
ENV_STATE_STORE = "MSHIP_STATE_STORE"            # memory:// or redis://...
ENV_REDIS_PASSWORD = "MSHIP_REDIS_PASSWORD"      # for a redis:// store URL without one
ENV_STATE_RETENTION_S = "MSHIP_STATE_RETENTION_S"  # stored responses: kept this long after their last write
# How long a stored response (its snapshot, run and event log) is kept after its last write, as
# OpenAI keeps responses: 30 days. 0 keeps them until deleted.
DEFAULT_STATE_RETENTION_S = 30 * 24 * 3600.0
ENV_CACHE_DIR = "MSHIP_CACHE_DIR"                # built models (default ~/.cache/mship)
ENV_TRUST_IDENTITY_HEADER = "MSHIP_TRUST_IDENTITY_HEADER"  # "1": honour x-mship-identity (older spelling)
ENV_TRUSTED_IDENTITY_HEADER = "MSHIP_TRUSTED_IDENTITY_HEADER"  # e.g. x-user: a proxy in front authenticates
ENV_API_KEYS = "MSHIP_API_KEYS"                  # key:identity,...
ENV_API_KEYS_FILE = "MSHIP_API_KEYS_FILE"        # one key:identity a line; re-read on change
ENV_RATE_LIMITS_FILE = "MSHIP_RATE_LIMITS_FILE"  # per-identity rate-limit overrides (YAML)
ENV_MAX_REQUEST_BODY_BYTES = "MSHIP_MAX_REQUEST_BODY_BYTES"
ENV_CORS_ORIGINS = "MSHIP_CORS_ORIGINS"          # comma-separated origins; default none
ENV_MAX_CONNECTIONS = "MSHIP_MAX_CONNECTIONS"    # open HTTP connections per gateway replica (from the fd limit)
# The proxies whose X-Forwarded-For / X-Forwarded-Proto a gateway believes (the client address of
# the audit trail): comma-separated addresses or networks, `*` for any; default the node itself.
ENV_FORWARDED_ALLOW_IPS = "MSHIP_FORWARDED_ALLOW_IPS"
DEFAULT_FORWARDED_ALLOW_IPS = "127.0.0.1,::1"
ENV_AUDIT_LOG = "MSHIP_AUDIT_LOG"                # a file path, or "-" for the log stream
ENV_AUDIT_CONTENT = "MSHIP_AUDIT_CONTENT"        # "1": audit records carry prompts and completions
ENV_COMPACTION_KEY = "MSHIP_COMPACTION_KEY"      # base64 of 32 bytes, shared by every gateway replica
ENV_RAY_AUTH_TOKEN = "MSHIP_RAY_AUTH_TOKEN"      # the cluster token: Ray's, and the platform's own gRPC
ENV_BREAKER_FAILURES = "MSHIP_BREAKER_FAILURES"    # consecutive failures that take an endpoint out (3)
ENV_BREAKER_COOLDOWN_S = "MSHIP_BREAKER_COOLDOWN_S"  # how long it stays out before a health probe (5)
ENV_MCP_ALLOWED_HOSTS = "MSHIP_MCP_ALLOWED_HOSTS"  # MCP servers /v1/responses may call (services.gateway.mcp.egress)
ENV_MCP_TIMEOUT_S = "MSHIP_MCP_TIMEOUT_S"          # per MCP list or call, connecting included (30)
ENV_MAX_AUDIO_BYTES = "MSHIP_MAX_AUDIO_BYTES"      # /v1/audio/transcriptions: the largest file (25 MB)
ENV_MAX_AUDIO_SECONDS = "MSHIP_MAX_AUDIO_SECONDS"  # a transcription worker: the longest audio (1500 s)
ENV_REPLICA_PICKER = "MSHIP_REPLICA_PICKER"        # prefix_affinity (default) | least_outstanding
ENV_ENGINE_SPIN_S = "MSHIP_ENGINE_SPIN_S"          # vLLM's busy-wait between steps (CPU engines: 0.003 s)
# Telemetry: set per node (the Ray node's environment, which its replicas inherit), not per job.
ENV_LOG_FORMAT = "MSHIP_LOG_FORMAT"      # text (default) | json
ENV_LOG_LEVEL = "MSHIP_LOG_LEVEL"        # DEBUG | INFO (default) | WARNING | ERROR
ENV_LOG_TARGET = "MSHIP_LOG_TARGET"      # syslog://host:port (UDP) | syslog+tcp://host:port; unset: stderr
ENV_OTEL_ENDPOINT = "MSHIP_OTEL_ENDPOINT"  # OTLP/gRPC collector host:port; unset: tracing off
ENV_NO_METRICS = "MSHIP_NO_METRICS"     # 1: record no per-request metrics at the edge (`--no-metrics`)
ENV_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's (and vLLM's) multiprocess directory
ENV_NODE_CAPABILITIES = "MSHIP_NODE_CAPABILITIES"  # JSON list of loaders this node runs (overrides probes)
# GCS fault tolerance on the head, as KubeRay's gcsFaultToleranceOptions sets it up (their names, not ours).
ENV_GCS_REDIS_ADDRESS = "RAY_REDIS_ADDRESS"  # host:port of the GCS's Redis; Ray reads it itself
ENV_GCS_REDIS_PASSWORD = "REDIS_PASSWORD"    # Ray reads none: `mship start` passes `--redis-password`
ENV_GCS_STORAGE_NAMESPACE = "RAY_external_storage_namespace"  # the GCS's key prefix in Redis; Ray reads it

# Passed from `mship start` to every replica of the job. (Not the token: every node's Ray processes
# inherit it from the node's own environment, so it never sits in the job's runtime_env.)
PLATFORM_ENV = (ENV_CACHE_DIR, ENV_REDIS_PASSWORD, ENV_TRUST_IDENTITY_HEADER, ENV_COMPACTION_KEY,
                ENV_TRUSTED_IDENTITY_HEADER, ENV_API_KEYS, ENV_API_KEYS_FILE, ENV_RATE_LIMITS_FILE,
                ENV_MAX_REQUEST_BODY_BYTES, ENV_MAX_CONNECTIONS, ENV_FORWARDED_ALLOW_IPS, ENV_CORS_ORIGINS,
                ENV_AUDIT_LOG, ENV_AUDIT_CONTENT, ENV_BREAKER_FAILURES, ENV_BREAKER_COOLDOWN_S,
                ENV_MCP_ALLOWED_HOSTS, ENV_MCP_TIMEOUT_S, ENV_MAX_AUDIO_BYTES, ENV_MAX_AUDIO_SECONDS,
                ENV_REPLICA_PICKER, ENV_ENGINE_SPIN_S, ENV_STATE_RETENTION_S, ENV_STREAM_DRAIN_S)


def seconds_from_env(name: str, default: float, hint: str) -> float:
    """A duration setting from the environment: unset or empty is `default`; else seconds >= 0."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{name}={value!r}: give seconds ({hint})")
    return seconds


def stream_drain_s() -> float:
    """The platform's stream drain: $MSHIP_STREAM_DRAIN_S (`mship start` checks it and hands it to
    every replica), else DEFAULT_STREAM_DRAIN_S."""
    return seconds_from_env(ENV_STREAM_DRAIN_S, DEFAULT_STREAM_DRAIN_S,
                            "a stopping replica's time for its streams, e.g. 1800; 0: cut them at once")


def state_retention_s() -> float:
    return seconds_from_env(ENV_STATE_RETENTION_S, DEFAULT_STATE_RETENTION_S, "0: keep stored responses until deleted")


def max_connections() -> int | None:
    """A gateway replica's cap on open HTTP connections: $MSHIP_MAX_CONNECTIONS, a whole number (0:
    no cap); None when unset (the replica derives it from its open-file limit)."""
    value = os.environ.get(ENV_MAX_CONNECTIONS, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{ENV_MAX_CONNECTIONS}={value!r}: give a whole number of connections (0: no cap)")
    return int(value)


def forwarded_allow_ips() -> str:
    """The proxies a gateway replica believes forwarded headers from ($MSHIP_FORWARDED_ALLOW_IPS,
    else DEFAULT_FORWARDED_ALLOW_IPS), as uvicorn takes them: each entry an IP address, a network
    (10.0.0.0/8) or `*`. A typo is refused here: uvicorn would take it for a literal host name
    and believe no proxy."""
    value = os.environ.get(ENV_FORWARDED_ALLOW_IPS, "").strip()
    if not value:
        return DEFAULT_FORWARDED_ALLOW_IPS
    entries = [entry.strip() for entry in value.split(",")]
    for entry in entries:
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"{ENV_FORWARDED_ALLOW_IPS}={value!r}: {entry!r} is not an IP address, a network "
                             "or *") from None
    return ",".join(entries)
