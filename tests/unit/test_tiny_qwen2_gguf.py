"""builtin:tiny-qwen2 as GGUF without an engine: a small Qwen2 directory made the way the builder
makes one (its tokenizer pipeline, random bf16 weights, fewer tokens than vocab_size) is
converted, and the file read back: architecture and shapes, exact weights, the tokenizer as
llama.cpp's own converter states it, the chat template; and resolve_gguf builds it once.
(That llama.cpp tokenizes and generates like HF is tests/integration/test_tool_calls.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, TokenType
from safetensors.torch import save_file

from services.worker import gguf_models
from services.worker.builtin import tiny_qwen2, tiny_qwen2_gguf

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 320, 32, 2, 2, 1, 64  # GQA: kv heads != heads


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-qwen2-hf")
    texts = ["What is the weather in Paris?", "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "Zürich 42"]
    tok = tiny_qwen2._build_tokenizer(texts * 5)
    assert len(tok) < VOCAB  # so the GGUF's vocabulary gets padded
    tok.save_pretrained(d)  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": True,
        "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}))
    gen = torch.Generator().manual_seed(0)
    kv = HIDDEN // HEADS * KV_HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                   p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.q_proj.bias": (HIDDEN,),
                   p + "self_attn.k_proj.weight": (kv, HIDDEN), p + "self_attn.k_proj.bias": (kv,),
                   p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.v_proj.bias": (kv,),
                   p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN), p + "mlp.gate_proj.weight": (FFN, HIDDEN),
                   p + "mlp.up_proj.weight": (FFN, HIDDEN), p + "mlp.down_proj.weight": (HIDDEN, FFN)}
    save_file({k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()},
              str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def gguf(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GGUFReader:
    out = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    tiny_qwen2_gguf.convert(hf_dir, out)
    return GGUFReader(str(out))


def field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def test_architecture_and_hyperparameters(gguf):
    assert field(gguf, "general.architecture") == "qwen2"
    got = {k: field(gguf, f"qwen2.{k}") for k in ("block_count", "embedding_length", "feed_forward_length",
                                                  "attention.head_count", "attention.head_count_kv",
                                                  "context_length")}
    assert got == {"block_count": LAYERS, "embedding_length": HIDDEN, "feed_forward_length": FFN,
                   "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "context_length": 512}
    assert field(gguf, "qwen2.rope.freq_base") == 10000.0
    assert field(gguf, "qwen2.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)


def test_weights_are_the_bf16_values_exactly_in_f32(gguf, hf_dir):
    from safetensors.torch import load_file

    state = load_file(str(hf_dir / "model.safetensors"))
    tensors = {t.name: t for t in gguf.tensors}
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd
    assert len(tensors) == len(state)
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "blk.1.attn_k.weight": "model.layers.1.self_attn.k_proj.weight",
             "blk.1.attn_q.bias": "model.layers.1.self_attn.q_proj.bias",
             "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight"}
    for name, key in pairs.items():
        t = tensors[name]
        assert t.tensor_type == GGMLQuantizationType.F32
        assert np.array_equal(np.asarray(t.data), state[key].to(torch.float32).numpy()), name


def test_tokenizer_as_llama_cpp_states_a_qwen2_one(gguf, hf_dir):
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tokens, types = field(gguf, "tokenizer.ggml.tokens"), field(gguf, "tokenizer.ggml.token_type")
    assert (field(gguf, "tokenizer.ggml.model"), field(gguf, "tokenizer.ggml.pre")) == ("gpt2", "qwen2")
    assert len(tokens) == len(types) == VOCAB
    n = 1 + max([*tok["model"]["vocab"].values(), *(a["id"] for a in tok["added_tokens"])])  # real tokens
    for text, i in tok["model"]["vocab"].items():
        assert tokens[i] == text
    kinds = {t: TokenType(types[tokens.index(t)]) for t in [*tiny_qwen2.SPECIAL_TOKENS, *tiny_qwen2.TAG_TOKENS]}
    assert kinds == {**dict.fromkeys(tiny_qwen2.SPECIAL_TOKENS, TokenType.CONTROL),
                     **dict.fromkeys(tiny_qwen2.TAG_TOKENS, TokenType.USER_DEFINED)}  # tags: plain text
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, VOCAB)]
    assert {TokenType(t) for t in types[n:]} == {TokenType.UNUSED}
    assert field(gguf, "tokenizer.ggml.merges") == [" ".join(m) for m in tok["model"]["merges"]]
    ids = {k: field(gguf, f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")}
    assert ids == {"bos": 0, "eos": tokens.index("<|im_end|>"), "padding": tokens.index("<|endoftext|>")}
    assert field(gguf, "tokenizer.ggml.add_bos_token") is False  # the HF tokenizer adds none either


def test_the_chat_template_is_the_builders(gguf):
    assert field(gguf, "tokenizer.chat_template") == tiny_qwen2.CHAT_TEMPLATE


def test_resolve_gguf_converts_once_into_the_cache(hf_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MSHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gguf_models, "resolve_model_ref", lambda ref: str(hf_dir))  # no 6-minute build
    calls = []
    convert = tiny_qwen2_gguf.convert
    monkeypatch.setattr(tiny_qwen2_gguf, "convert", lambda src, out: calls.append(src) or convert(src, out))
    path, template = gguf_models.resolve_gguf("builtin:tiny-qwen2")
    assert path == tmp_path / "models" / "gguf" / f"tiny-qwen2-{tiny_qwen2.BUILD_VERSION}-f32-v1.gguf"
    assert template == "" and path.is_file()  # its template is in the file
    assert gguf_models.resolve_gguf("builtin:tiny-qwen2") == (path, "")
    assert calls == [hf_dir] and not list(path.parent.glob("*.tmp-*"))
