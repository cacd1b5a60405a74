"""The worker's Prometheus series (docs/metrics.md). Per request: outcome and tokens, counted
when the request ends. Sampled each heartbeat (1 s): running and queued requests, KV-cache use.
The engines' own series come as they are: vLLM's `vllm:*` (its stat loggers write to the node's
metrics directory too, labelled with the served model name)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REQUESTS = Counter("mship_worker_requests", "Infer calls that ended, by outcome (finished | cancelled | "
                   "refused | failed)", ["model", "outcome"])
PROMPT_TOKENS = Counter("mship_worker_prompt_tokens", "prompt tokens of finished requests", ["model"])
CACHED_TOKENS = Counter("mship_worker_cached_prompt_tokens", "of those, served from the prefix cache "
                        "(hit rate: rate(cached) / rate(prompt))", ["model"])
GENERATION_TOKENS = Counter("mship_worker_generation_tokens", "tokens generated", ["model"])
RUNNING = Gauge("mship_worker_running_requests", "requests in the engine (backpressure places taken)", ["model"],
                multiprocess_mode="livesum")
QUEUED = Gauge("mship_worker_queued_requests", "requests waiting for a place", ["model"],
               multiprocess_mode="livesum")
KV_CACHE = Gauge("mship_worker_kv_cache_usage_ratio", "KV-cache in use, 0-1, per replica process", ["model"],
                 multiprocess_mode="liveall")
LOAD_SECONDS = Gauge("mship_worker_load_seconds", "engine load time of each live replica", ["model"],
                     multiprocess_mode="liveall")
ENGINE_DEATHS = Counter("mship_worker_engine_deaths",
                        "engines found dead, or hung and killed (each replica is then replaced)", ["model"])
