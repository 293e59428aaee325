"""rlx's hand-written decode step gives the logits of the transformers forward (Llama, Qwen2 with biases,
Qwen3 with q/k norms and grouped-query attention), with left padding and rows leaving the batch, and
computes peft LoRA linears as peft does, and declines what it does not reproduce (DoRA, other architectures)."""

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import rlx.engines.hf as hf
from rlx.engines.fast_decode import decode_step_for
from rlx.engines.hf import generation_cache
from rlx.models.forward import position_ids_from_mask

SIZES = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64,
             pad_token_id=0)


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**SIZES, num_attention_heads=4, num_key_value_heads=4)).eval()
    if kind == "qwen2":  # q/k/v biases
        model = Qwen2ForCausalLM(Qwen2Config(**SIZES, num_attention_heads=4, num_key_value_heads=2))
        for layer in model.model.layers:  # random biases (they start at zero), so a missed bias would show
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
        return model.eval()
    config = Qwen3Config(**SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = Qwen3ForCausalLM(config)
    for layer in model.model.layers:  # q/k norm weights start at one; make them matter
        torch.nn.init.normal_(layer.self_attn.q_norm.weight, mean=1.0, std=0.5)
        torch.nn.init.normal_(layer.self_attn.k_norm.weight, mean=1.0, std=0.5)
    return model.eval()


@torch.no_grad()
def _max_logit_gap(model, onednn: bool = False) -> float:
    """Decode 6 tokens both ways from the same prefill (row 0 left-padded, row 2 leaving after 3 steps)."""
    g = torch.Generator().manual_seed(3)
    prompt_ids = torch.randint(1, 61, (3, 5), generator=g)  # (b, P)
    prompt_mask = torch.ones(3, 5, dtype=torch.long)
    prompt_mask[0, :2] = 0
    positions = position_ids_from_mask(prompt_mask)
    caches = []
    for _ in range(2):
        cache = generation_cache(model, 8)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        caches.append(out.past_key_values)
    step = decode_step_for(model, onednn=onednn)
    assert step is not None and bool(step.packed) == onednn  # 7 projections x 2 layers + the head
    token = out.logits[:, -1].argmax(-1)  # (b,)
    attention, position, gap = prompt_mask, positions[:, -1] + 1, 0.0
    for t in range(6):
        if t == 3:  # row 2 stops: both caches drop it
            keep = torch.tensor([0, 1])
            token, attention, position = token[keep], attention[keep], position[keep]
            for cache in caches:
                cache.batch_select_indices(keep)
        attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], dim=1)
        want = model(input_ids=token.unsqueeze(1), attention_mask=attention, position_ids=position.unsqueeze(1),
                     past_key_values=caches[0], use_cache=True).logits[:, -1]
        got = step(token, position, attention, caches[1])
        gap = max(gap, (got - want).abs().max().item())
        token, position = want.argmax(-1), position + 1
    return gap


def test_decode_step_matches_transformers_forward():
    for kind in ("llama", "qwen2", "qwen3"):
        assert _max_logit_gap(_model(kind)) < 1e-4, kind


def test_onednn_decode_step_matches_transformers_forward():
    """rollout.onednn_decode: the projections through oneDNN copies of the weights give the same logits."""
    for kind in ("llama", "qwen2", "qwen3"):
        assert _max_logit_gap(_model(kind), onednn=True) < 1e-4, kind


def test_onednn_generation_is_independent_of_chunking():
    """Seeded draws stay per-row with the oneDNN step: rows generated together or apart draw the same tokens."""
    from rlx.config.paths import ASSETS_DIR
    from rlx.models.loading import load_causal_lm, load_tokenizer

    model, tokenizer = load_causal_lm(str(ASSETS_DIR / "tiny")), load_tokenizer(str(ASSETS_DIR / "tiny"))
    prompts = ["What is 3 + 4 =", "State the final answer: 12 - 5 + 1 =", "Compute 2 + 2 ="]
    kwargs = dict(samples_per_prompt=2, max_new_tokens=12, seeds=list(range(6)), onednn=True)
    whole = hf.generate(model, tokenizer, prompts, batch_size=6, **kwargs)
    chunked = hf.generate(model, tokenizer, prompts, batch_size=2, **kwargs)
    assert whole.texts == chunked.texts


def _assert_same_draws_with_and_without_the_fast_step(model, tokenizer, monkeypatch):
    prompts = ["What is 3 + 4 =", "State the final answer: 12 - 5 + 1 ="]
    kwargs = dict(samples_per_prompt=4, max_new_tokens=12, seeds=list(range(8)))
    fast = hf.generate(model, tokenizer, prompts, **kwargs)
    monkeypatch.setattr(hf, "decode_step_for", lambda m, **_: None)
    slow = hf.generate(model, tokenizer, prompts, **kwargs)
    assert torch.equal(fast.completion_ids, slow.completion_ids) and fast.texts == slow.texts


def test_generate_draws_the_same_tokens_with_and_without_the_fast_step(monkeypatch):
    from rlx.config.paths import ASSETS_DIR
    from rlx.models.loading import load_causal_lm, load_tokenizer

    model, tokenizer = load_causal_lm(str(ASSETS_DIR / "tiny")), load_tokenizer(str(ASSETS_DIR / "tiny"))
    _assert_same_draws_with_and_without_the_fast_step(model, tokenizer, monkeypatch)


def _lora(kind: str = "qwen2", **config):
    """A peft LoRA model on every projection with random B (peft starts B at zero: the adapters would not show)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(kind), LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", **config))
    torch.manual_seed(1)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.3)
    return model.eval()


def test_decode_step_computes_lora_linears_like_peft():
    """A LoRA policy decodes through rlx's step: base x W^T + b plus scaling * B(A(x)) per projection; the
    peft wrapper itself is accepted. With the adapters switched off the step follows the base model."""
    for kind in ("llama", "qwen2", "qwen3"):
        model = _lora(kind)
        assert _max_logit_gap(model) < 1e-4, kind
        assert _max_logit_gap(model, onednn=True) < 1e-4, kind
    model = _lora("qwen2", lora_bias=True)
    for name, param in model.named_parameters():
        if "lora_B" in name and name.endswith("bias"):
            torch.nn.init.normal_(param, std=0.3)
    assert _max_logit_gap(model) < 1e-4
    with model.disable_adapter():
        assert _max_logit_gap(model) < 1e-4


def test_generate_draws_the_same_tokens_for_a_lora_policy_with_and_without_the_fast_step(monkeypatch):
    from peft import LoraConfig, get_peft_model

    from rlx.config.paths import ASSETS_DIR
    from rlx.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(ASSETS_DIR / "tiny"))
    model = get_peft_model(load_causal_lm(str(ASSETS_DIR / "tiny")), LoraConfig(r=4, target_modules="all-linear"))
    torch.manual_seed(2)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    assert decode_step_for(model) is not None
    _assert_same_draws_with_and_without_the_fast_step(model, tokenizer, monkeypatch)


def test_decode_step_declines_dora_and_other_architectures():
    assert decode_step_for(_lora("llama", use_dora=True)) is None  # DoRA rescales the merged weight: its own forward
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_embd=32, n_layer=1, n_head=2))
    assert decode_step_for(gpt2) is None
    assert decode_step_for(_model("llama")) is not None
