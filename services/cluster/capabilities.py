"""What engines a node can really run, advertised as Ray custom resources `mship_<loader>`.

Every model replica requests its loader's resource, so Ray places it only on a node that can run
its engine; a model no node can host stays pending (the coordinator names the missing resource).
`MSHIP_NODE_CAPABILITIES` (a JSON list such as `["vllm"]`; `[]` for none) overrides the probes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

from services.common.vocabulary import (
    ENV_NODE_CAPABILITIES,
    GATEWAY_RESOURCE,
    IMPLEMENTED_LOADERS,
    capability_resource,
)

# A node advertises this many of a capability and each replica requests one: the capability says
# what can run there; CPUs, GPUs and memory say how much.
SLOTS = 1000.0


class CapabilityError(ValueError):
    pass


def _vllm() -> bool:
    # vLLM: the import check without paying for the import (seconds): both packages are installed.
    return all(importlib.util.find_spec(name) is not None for name in ("vllm", "torch"))


def _llama_cpp() -> bool:
    """llama.cpp's server runs here: the packaged llama-server (installed, its binary starts, this
    CPU has what it was compiled for), or else the portable xllamacpp build it falls back to."""
    from services.worker.llama_server import packaged_unfit_reason

    return packaged_unfit_reason() is None or importlib.util.find_spec("xllamacpp") is not None


def _installed(*names: str) -> Callable[[], bool]:
    """The audio engines: their packages are installed (found without importing them)."""
    return lambda: all(importlib.util.find_spec(name) is not None for name in names)


PROBES: dict[str, Callable[[], bool]] = {
    "vllm": _vllm, "llama_cpp": _llama_cpp,
    "piper": _installed("piper", "onnxruntime"),  # piper-tts (espeak-ng inside) on onnxruntime
    "faster_whisper": _installed("faster_whisper", "ctranslate2", "av"),  # CTranslate2; PyAV decodes uploads
}


def parse(text: str) -> list[str]:
    """An `MSHIP_NODE_CAPABILITIES` value: a JSON list of loader names."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CapabilityError(f"{ENV_NODE_CAPABILITIES} must be a JSON list such as '[\"vllm\"]': {e}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CapabilityError(f"{ENV_NODE_CAPABILITIES} must be a JSON list of loader names, got {text!r}")
    unknown = sorted(set(value) - IMPLEMENTED_LOADERS)
    if unknown:
        raise CapabilityError(f"{ENV_NODE_CAPABILITIES}: unknown loader(s) {unknown}; known: "
                              f"{sorted(IMPLEMENTED_LOADERS)}")
    return sorted(set(value))


def node_capabilities(env: Mapping[str, str] = os.environ) -> list[str]:
    """The loaders this node runs: the override if set, else those whose probe passes."""
    if ENV_NODE_CAPABILITIES in env:
        return parse(env[ENV_NODE_CAPABILITIES])
    return sorted(loader for loader, probe in PROBES.items() if loader in IMPLEMENTED_LOADERS and probe())


def resources(capabilities: list[str]) -> dict[str, float]:
    """Ray custom resources for `ray start --resources`."""
    return {capability_resource(loader): SLOTS for loader in capabilities}


def node_resources(capabilities: list[str], *, gateway: bool) -> dict[str, float]:
    """A node's custom resources: its engines, and `mship_gateway` where gateway replicas may run."""
    return {**resources(capabilities), **({GATEWAY_RESOURCE: SLOTS} if gateway else {})}


def capabilities_of(node_resources: Mapping[str, float]) -> list[str]:
    """The loaders a node advertises, read back from its Ray resources (only loader resources:
    `mship_gateway` and Ray's own are not capabilities)."""
    return sorted(loader for loader in IMPLEMENTED_LOADERS if node_resources.get(capability_resource(loader), 0) > 0)


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
