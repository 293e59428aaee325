"""Build the tiny model from scratch: a byte-level BPE tokenizer trained on task text and a small Llama.

Everything here is deterministic given the corpus and the seed, so `rlx train tiny_sft` rebuilds the
shipped asset (rlx/models/assets/tiny) rather than trusting an opaque file.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
# ChatML-style template: <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with digits split one per token (arithmetic stays learnable) and ChatML specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    roles = ["user", "assistant", "system"] * 8
    tok.train_from_iterator(list(corpus) + roles, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model
