"""Random-init models with the published shapes of real checkpoints, built offline.

The memory, the speed and most numerical traps of a real model come from its shape (a 151,936-entry
vocabulary, grouped-query attention, tied embeddings, bf16), not from its trained weights. This module
writes a save_pretrained folder with one of those shapes (optionally fewer layers or a smaller
vocabulary) and a tokenizer covering its whole vocabulary, so `rlx train model.path=<folder>` exercises
real-model code paths without a download: the CPU proofs (tests/test_real_shapes.py), the GPU smoke
test (scripts/gpu_smoke.sh) and benchmarks use it.

    python -m rlx.models.shapes qwen2.5-0.5b /tmp/qwen-shape --layers 2 [--vocab 32768] [--dtype bfloat16]

The tokenizer is the shipped tiny model's byte-level BPE (its merges and ChatML template) grown with
plain vocabulary entries up to the model's vocabulary size: text encodes with the small vocabulary,
and every id the model can sample decodes to a string.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rlx.config.paths import ASSETS_DIR

# Published configurations (config.json on the hub) of the model presets' checkpoints.
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(  # Qwen/Qwen2.5-0.5B-Instruct: 494M parameters
        model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151_936, tie_word_embeddings=True, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32_768, use_sliding_window=False, sliding_window=None,
    ),
    "qwen3-0.6b": dict(  # Qwen/Qwen3-0.6B: 596M parameters
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151_936, tie_word_embeddings=True, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, max_position_embeddings=40_960, use_sliding_window=False, sliding_window=None,
    ),
    "llama-3.2-1b": dict(  # meta-llama/Llama-3.2-1B-Instruct: 1.24B parameters
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128_256, tie_word_embeddings=True, rms_norm_eps=1e-5,
        max_position_embeddings=131_072,
        rope_parameters=dict(rope_type="llama3", rope_theta=500_000.0, factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
}
TINY = ASSETS_DIR / "tiny"


def parameter_count(shape: str, num_layers: int | None = None, vocab_size: int | None = None) -> int:
    """Parameters of the shape (tied embeddings counted once), from the formula rather than a build."""
    spec = SHAPES[shape]
    hidden, inter = spec["hidden_size"], spec["intermediate_size"]
    heads, kv = spec["num_attention_heads"], spec["num_key_value_heads"]
    head_dim = spec.get("head_dim") or hidden // heads
    layers = spec["num_hidden_layers"] if num_layers is None else num_layers
    vocab = spec["vocab_size"] if vocab_size is None else vocab_size
    attention = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden  # q, k, v, o
    if spec["model_type"] == "qwen2":
        attention += head_dim * (heads + 2 * kv)  # q, k, v biases
    if spec["model_type"] == "qwen3":
        attention += 2 * head_dim  # per-head q/k RMSNorm
    per_layer = attention + 3 * hidden * inter + 2 * hidden  # MLP + two RMSNorms
    return vocab * hidden + layers * per_layer + hidden  # embedding (tied head) + layers + final norm


def grow_tokenizer(folder: Path, vocab_size: int) -> None:
    """Write the tiny tokenizer with `vocab_size` entries into `folder` (tokenizer.json + config files).

    New entries are "qz<letters><n>" strings of the byte-level alphabet, reachable only by sampling."""
    spec = json.loads((TINY / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in spec.get("added_tokens", [])}
    next_id = max(taken) + 1
    if vocab_size < next_id:
        raise ValueError(f"vocab_size {vocab_size} is below the tiny tokenizer's {next_id} entries")
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while next_id < vocab_size:
        word, n = "", i
        for _ in range(4):
            word, n = word + letters[n % 26], n // 26
        word = f"qz{word}{i // 26**4}"
        if word not in vocab:
            vocab[word] = next_id
            next_id += 1
        i += 1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (folder / name).write_text((TINY / name).read_text())


def model_config(shape: str, num_layers: int | None = None, vocab_size: int | None = None, **token_ids):
    """The transformers config of `shape`, with fewer layers / another vocabulary size when given."""
    from transformers import AutoConfig

    spec = dict(SHAPES[shape])
    model_type = spec.pop("model_type")
    if num_layers is not None:
        spec["num_hidden_layers"] = num_layers
        if model_type == "qwen2":
            spec["max_window_layers"] = num_layers
    if vocab_size is not None:
        spec["vocab_size"] = vocab_size
    return AutoConfig.for_model(model_type, hidden_act="silu", bos_token_id=None, **spec, **token_ids)


def build_shaped_model(shape: str, folder: str | Path, num_layers: int | None = None, vocab_size: int | None = None,
                       dtype: str = "float32", seed: int = 0) -> Path:
    """Write a random-init `shape` model and its tokenizer to `folder` (save_pretrained format). Returns it.

    num_layers / vocab_size override the published values (fewer layers and a smaller vocabulary keep CPU
    proofs affordable); dtype: float32 | bfloat16, the dtype the weights are stored in."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown shape '{shape}'; valid choices: {', '.join(SHAPES)}")
    folder = Path(folder)
    vocab = SHAPES[shape]["vocab_size"] if vocab_size is None else vocab_size
    grow_tokenizer(folder, vocab)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if len(tokenizer) != vocab:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} entries, expected {vocab}")
    config = model_config(shape, num_layers, vocab, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a random-init model with a published shape (no download).")
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("folder")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the published number)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the published one)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = build_shaped_model(args.shape, args.folder, args.layers, args.vocab, args.dtype, args.seed)
    print(f"{folder}: {args.shape} shape, {parameter_count(args.shape, args.layers, args.vocab) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
