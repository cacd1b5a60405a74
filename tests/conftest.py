"""Test-wide settings: offline, loopback only, no phone-home."""

import os

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
for key, value in OFFLINE_ENV.items():
    os.environ.setdefault(key, value)
