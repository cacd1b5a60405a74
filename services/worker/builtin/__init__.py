"""Built-in models: `builtin:NAME` model refs that are built locally on first use.

`resolve_model_ref("builtin:tiny-qwen2")` returns a local directory that vLLM / transformers can
load, building it into the cache once (`$MSHIP_CACHE_DIR` or `~/.cache/mship`, under `models/`).
Any other ref (a Hugging Face id, a local path) passes through unchanged.

Importing this package is cheap: the builders import torch/transformers only inside `build()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from . import gemma3, minilm, piper_joe, smollm2, tiny_qwen2, tiny_vlm, whisper_base

BUILTIN_PREFIX = "builtin:"

# name -> module exposing `BUILD_VERSION: str` and `build(out_dir: Path) -> None`
BUILTINS: dict[str, ModuleType] = {"tiny-qwen2": tiny_qwen2, "gemma-3-270m": gemma3, "all-minilm-l6-v2": minilm,
                                   "smollm2-135m-instruct": smollm2, "piper-joe": piper_joe,
                                   "whisper-base": whisper_base, "tiny-vlm": tiny_vlm}

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Root of mship's local cache: `$MSHIP_CACHE_DIR`, else `~/.cache/mship`."""
    env = os.environ.get("MSHIP_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mship"


def is_builtin(ref: str) -> bool:
    """True for `builtin:NAME` refs (known or not)."""
    return ref.startswith(BUILTIN_PREFIX)


def builtin_names() -> list[str]:
    """Names accepted after `builtin:`."""
    return sorted(BUILTINS)


def _module(name: str) -> ModuleType:
    try:
        return BUILTINS[name]
    except KeyError:
        raise ValueError(
            f"unknown builtin model {name!r}; known: {', '.join(BUILTIN_PREFIX + n for n in builtin_names())}"
        ) from None


def resolve_model_ref(ref: str) -> str:
    """Map a model ref to something vLLM can load; builds `builtin:NAME` on first use."""
    if not is_builtin(ref):
        return ref
    name = ref[len(BUILTIN_PREFIX):]
    module = _module(name)
    models = cache_dir() / "models"
    target = models / f"{name}-{module.BUILD_VERSION}"
    if target.is_dir():  # fast path: the rename below makes a complete directory appear atomically
        return str(target)
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f"{target.name}.lock", "w") as lock:
        # Concurrent processes (workers, test sessions) queue here, so the model is built once.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.is_dir():  # someone else built it while we waited
                return str(target)
            # We hold the lock, so leftovers of a crashed build are not in use: reclaim the disk.
            for stale in models.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=models))
            try:
                log.info("building %s into %s", ref, target)
                module.build(tmp)
                tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
                os.rename(tmp, target)  # atomic: the target never exists half-built
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
    return str(target)
