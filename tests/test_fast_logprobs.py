"""Chunked log-probs equal the naive full-logits ones (values and gradients), use a fraction of the
memory, and match the distribution the sampler drew from."""

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlx.algorithms.logprobs import chunked_linear_logprobs, token_entropy, token_logprobs
from rlx.models.forward import LogprobSettings, completion_logprobs


def _tiny_llama(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def test_chunked_linear_equals_naive_with_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)  # (M, H)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)  # (V, H)
    bias = torch.randn(13, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (10,))
    upstream = torch.randn(10, dtype=torch.float64)  # arbitrary dLoss/dlogp

    logits = (hidden @ weight.t() + bias).unsqueeze(0)  # (1, M, V)
    naive = token_logprobs(logits, targets.unsqueeze(0))[0]
    naive_grads = torch.autograd.grad((naive * upstream).sum(), (hidden, weight, bias))
    # chunk of 3 rows: 4 chunks, the last one short
    chunked, entropy = chunked_linear_logprobs(hidden, weight, targets, bias=bias, chunk_tokens=3, with_entropy=True)
    chunked_grads = torch.autograd.grad((chunked.double() * upstream).sum(), (hidden, weight, bias))

    assert torch.allclose(chunked.double(), naive, atol=1e-6)
    for got, want in zip(chunked_grads, naive_grads):
        assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(entropy.double(), token_entropy(logits.detach())[0], atol=1e-6)
    # hand check of one value: logits [0, ln 3] -> log softmax = [ln 1/4, ln 3/4]
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    lp, _ = chunked_linear_logprobs(torch.tensor([[0.0, math.log(3.0)]]), two, torch.tensor([1]))
    assert abs(lp.item() - torch.tensor(0.75).log().item()) < 1e-6


def _batch(vocab_size: int, n: int = 3, p: int = 4, c: int = 6):
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(1, vocab_size, (n, p), generator=g)  # (N, P)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding on row 0
    completion_ids = torch.randint(1, vocab_size, (n, c), generator=g)  # (N, C)
    completion_mask = torch.ones(n, c, dtype=torch.long)
    completion_mask[1, 4:] = 0  # row 1 ended after 4 tokens
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def test_completion_logprobs_chunked_equals_plain_forward():
    model = _tiny_llama(50)
    batch = _batch(50)
    mask = batch[3].bool()
    plain, plain_entropy = completion_logprobs(model, *batch, with_entropy=True,
                                               settings=LogprobSettings(chunked=False))
    plain_grads = torch.autograd.grad(plain[mask].sum(), list(model.parameters()))
    chunked, chunked_entropy = completion_logprobs(model, *batch, with_entropy=True,
                                                   settings=LogprobSettings(chunked=True))
    chunked_grads = torch.autograd.grad(chunked[mask].sum(), list(model.parameters()))
    assert torch.allclose(chunked[mask], plain[mask], atol=1e-5)
    assert torch.allclose(chunked_entropy[mask], plain_entropy[mask], atol=1e-5)
    assert (chunked[~mask] == 0).all()
    for got, want in zip(chunked_grads, plain_grads):
        assert torch.allclose(got, want, atol=1e-5)


def _saved_bytes(model, batch, chunked: bool) -> int:
    """Bytes autograd keeps for the backward pass of a log-prob forward (the memory that scales with V)."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = completion_logprobs(model, *batch, settings=LogprobSettings(chunked=chunked))
    logp.sum().backward()
    return total


def test_chunked_memory_does_not_scale_with_vocab_x_tokens():
    vocab = 20000
    model = _tiny_llama(vocab)
    batch = _batch(vocab, n=4, p=4, c=32)
    naive = _saved_bytes(model, batch, chunked=False)
    chunked = _saved_bytes(model, batch, chunked=True)
    logits_bytes = 4 * 36 * vocab * 4  # the (N, P+C, V) float32 logits alone: 11.5 MB
    assert naive > logits_bytes
    assert chunked < naive / 2
    assert chunked < logits_bytes / 4


def test_training_logprobs_match_sampler_distribution(monkeypatch):
    """At temperature 1 the training forward scores each sampled token with the probability it was drawn with."""
    import rlx.engines.hf as hf
    from rlx.engines.sampling import sample_seed
    from rlx.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    drawn = []  # (completion position, global rows, log-probs of the drawn tokens under the sampler's logits)
    real_sample = hf.sample_tokens

    def recording(logits, seeds, position, *args):
        tokens = real_sample(logits, seeds, position, *args)
        drawn.append((position, seeds.clone(), torch.log_softmax(logits.double(), -1).gather(1, tokens[:, None])[:, 0]))
        return tokens

    monkeypatch.setattr(hf, "sample_tokens", recording)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + 4 + 1"}], tokenize=False,
                                       add_generation_prompt=True) for a in (2, 17)]
    seeds = [sample_seed(3, 0, i) for i in range(6)]
    rollout = hf.generate(model, tok, prompts, samples_per_prompt=3, max_new_tokens=12, seeds=seeds)
    logp, _ = completion_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                  rollout.completion_mask)
    row_of_seed = {s: i for i, s in enumerate(seeds)}
    checked = 0
    for position, row_seeds, sampler_logp in drawn:
        for seed, value in zip(row_seeds.tolist(), sampler_logp.tolist()):
            assert abs(logp[row_of_seed[seed], position].item() - value) < 1e-4
            checked += 1
    assert checked == int(rollout.completion_mask.sum())


def test_shared_prompt_pass_equals_plain_forward():
    """Rows with the same prompt (a GRPO group) encode it once; values and gradients are unchanged."""
    from rlx.models.forward import prompt_groups

    model = _tiny_llama(50).train()
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(50, n=2, p=5, c=6)
    prompt_mask[1, :1] = 0
    # 3 samples of prompt 0, then 2 of prompt 1
    batch = (prompt_ids[[0, 0, 0, 1, 1]], prompt_mask[[0, 0, 0, 1, 1]],
             torch.randint(1, 50, (5, 6), generator=torch.Generator().manual_seed(2)),
             torch.ones(5, 6, dtype=torch.long))
    batch[3][2, 3:] = 0
    first, group = prompt_groups(batch[0], batch[1])
    assert first.tolist() == [0, 3] and group.tolist() == [0, 0, 0, 1, 1]
    mask = batch[3].bool()
    plain, _ = completion_logprobs(model, *batch, settings=LogprobSettings(chunked=False))
    plain_grads = torch.autograd.grad(plain[mask].sum(), list(model.parameters()))
    shared, _ = completion_logprobs(model, *batch)
    shared_grads = torch.autograd.grad(shared[mask].sum(), list(model.parameters()))
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5)
    for got, want in zip(shared_grads, plain_grads):
        assert torch.allclose(got, want, atol=1e-5)
