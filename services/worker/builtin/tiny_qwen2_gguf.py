"""`builtin:tiny-qwen2` for the llama_cpp loader: the built Hugging Face directory (`tiny_qwen2.py`)
written as a GGUF (architecture qwen2), the reverse of `gguf_to_hf.py`.

Exact rather than small (the model has ~0.9M parameters): the bf16 weights become F32, which
holds every bf16 value exactly, so llama.cpp runs the very weights vLLM runs. The tokenizer is
stated the way llama.cpp's `convert_hf_to_gguf.py` states a Qwen2 one: `gpt2` (byte-level BPE)
with the `qwen2` pre-tokenizer (llama.cpp's copy of Qwen2's split regex), the vocabulary in id
order padded to `vocab_size` with UNUSED `[PADn]` tokens, added tokens CONTROL when special
(`<|im_start|>`...) else USER_DEFINED (`<tool_call>`...: matched in any text, as in HF), the
merges, BOS/EOS/PAD ids from config.json / tokenizer_config.json, and the chat template
(chat_template.jinja) as `tokenizer.chat_template`. The NFC normalizer has no GGUF equivalent:
llama.cpp tokenizes text as given, which equals HF on NFC text (all the corpus is).
`services/worker/gguf_models.py` builds the file once into the cache (`convert`, here).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGUF_VERSION = "1"  # of this conversion; the file name also carries tiny_qwen2.BUILD_VERSION
ARCH = "qwen2"
PRE_TOKENIZER = "qwen2"  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2: the regex in tokenizer.json


def gguf_name(build_version: str) -> str:
    return f"tiny-qwen2-{build_version}-f32-v{GGUF_VERSION}.gguf"


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def vocabulary(hf_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens in id order, their gguf.TokenType values, merges as "a b") from tokenizer.json."""
    import gguf

    tok = _json(hf_dir / "tokenizer.json")
    if tok["model"]["type"] != "BPE":
        raise ValueError(f"{hf_dir}: expected a BPE tokenizer, got {tok['model']['type']}")
    by_id: dict[int, tuple[str, int]] = {i: (t, gguf.TokenType.NORMAL) for t, i in tok["model"]["vocab"].items()}
    for added in tok.get("added_tokens", []):
        # convert_hf_to_gguf: special (or special-looking `<|...|>`) -> CONTROL, else USER_DEFINED
        content = added["content"]
        looks_special = content.startswith("<|") and content.endswith("|>")
        by_id[added["id"]] = (content, gguf.TokenType.CONTROL if added["special"] or looks_special
                              else gguf.TokenType.USER_DEFINED)
    if max(by_id) >= vocab_size:
        raise ValueError(f"{hf_dir}: token id {max(by_id)} beyond vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        text, kind = by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED))  # embedding rows no token uses
        tokens.append(text)
        types.append(int(kind))
    # tokenizers >= 0.20 writes merges as pairs, older ones as "a b" strings
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, types, merges


def _adds_bos(tok: dict[str, Any], tok_config: dict[str, Any]) -> bool:
    """Whether the HF tokenizer puts a token before the text (its post-processor, else the config)."""
    post = tok.get("post_processor") or {}
    if post.get("type") == "TemplateProcessing":
        single = post.get("single") or []
        return bool(single) and "SpecialToken" in single[0]
    return bool(tok_config.get("add_bos_token", False))


def special_ids(hf_dir: Path, tokens: list[str]) -> dict[str, int]:
    """bos/eos/pad ids: tokenizer_config.json's tokens where set, else config.json's ids (as
    gguf.SpecialVocab resolves them)."""
    config, tok_config = _json(hf_dir / "config.json"), _json(hf_dir / "tokenizer_config.json")
    ids = {}
    for kind in ("bos", "eos", "pad"):
        token = tok_config.get(f"{kind}_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and token in tokens:
            ids[kind] = tokens.index(token)
        elif isinstance(config.get(f"{kind}_token_id"), int):
            ids[kind] = config[f"{kind}_token_id"]
    return ids


def convert(hf_dir: Path, out: Path) -> None:
    """Write the Qwen2 checkpoint in `hf_dir` as an F32 GGUF at `out`."""
    import gguf
    import torch
    from safetensors.torch import load_file

    t = time.monotonic()
    config = _json(hf_dir / "config.json")
    if config.get("model_type") != "qwen2":
        raise ValueError(f"{hf_dir}: not a qwen2 checkpoint ({config.get('model_type')})")
    n_layers, vocab_size = config["num_hidden_layers"], config["vocab_size"]
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{hf_dir}: rope scaling {rope['rope_type']!r} is not converted here")

    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("tiny-qwen2")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))

    tokens, types, merges = vocabulary(hf_dir, vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE_TOKENIZER)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = special_ids(hf_dir, tokens)
    for kind, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        if kind in ids:
            add(ids[kind])
    w.add_add_bos_token(_adds_bos(_json(hf_dir / "tokenizer.json"), _json(hf_dir / "tokenizer_config.json")))
    w.add_add_eos_token(False)
    template = hf_dir / "chat_template.jinja"
    if template.exists():
        w.add_chat_template(template.read_text())

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, n_layers)
    state = load_file(str(hf_dir / "model.safetensors"))
    for key, tensor in sorted(state.items()):
        if key == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # llama.cpp uses token_embd when `output` is absent
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{hf_dir}: no GGUF name for tensor {key}")
        w.add_tensor(name, tensor.to(torch.float32).numpy())  # bf16 -> f32 is exact
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    log.info("tiny-qwen2 GGUF: %d tensors, %d tokens -> %s (%.1fs)", len(state), len(tokens), out,
             time.monotonic() - t)
