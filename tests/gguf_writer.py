"""Write a GGUF file (F32, llama.cpp's layout) from a Hugging Face Llama folder, for tests/test_gguf.py.

What llama.cpp's convert_hf_to_gguf.py writes for a Llama model with a byte-level BPE tokenizer, reduced to
what transformers reads back: the llama.* hyperparameters, the tensors under llama.cpp's names (Q and K rows
permuted the way llama.cpp's rotary embedding wants them; transformers reverses it on load), and the tokenizer
as tokens, token types, merges, special ids and chat template. No output.weight: the embeddings are tied.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

TENSOR_NAMES = {  # transformers name (after model.layers.N.) -> llama.cpp name (after blk.N.)
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def permute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K permutation: per head, rows (half 0, half 1) interleaved -> (pairs). (out, in) -> same."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2,
                          *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def llama_tensors(folder: Path, config: dict) -> dict[str, np.ndarray]:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out = {}
    for name, value in load_file(str(folder / "model.safetensors")).items():
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = value
        elif name == "model.norm.weight":
            out["output_norm.weight"] = value
        elif name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            if rest == "self_attn.q_proj.weight":
                value = permute_rows(value, heads)
            elif rest == "self_attn.k_proj.weight":
                value = permute_rows(value, kv_heads)
            out[f"blk.{index}.{TENSOR_NAMES[rest]}"] = value
    return out


def write_gguf(folder: Path, path: Path, architecture: str = "llama", tokenizer: bool = True) -> Path:
    """folder: a save_pretrained LlamaForCausalLM with tied embeddings and a byte-level BPE tokenizer.json.
    architecture: general.architecture (the hyperparameter keys follow it); tokenizer=False leaves out tokenizer.*."""
    config = json.loads((folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch=architecture)
    writer.add_name(folder.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    writer.add_vocab_size(config["vocab_size"])
    if tokenizer:
        add_tokenizer(writer, folder)
    for name, value in llama_tensors(folder, config).items():
        writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer: gguf.GGUFWriter, folder: Path) -> None:
    """A byte-level BPE tokenizer.json as llama.cpp stores it (tokenizer.ggml.model = gpt2)."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "token ids must be 0..n-1"
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")  # llama.cpp's name for individual digits + the GPT-2 split, as the tiny model's
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    writer.add_eos_token_id(vocab[settings["eos_token"]])
    writer.add_pad_token_id(vocab[settings["pad_token"]])
    template = folder / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())
