"""rlx's own decoder keeps the log-prob of each token it samples (engines/hf.py generate(logprobs=True)), and the
single-turn loops compare it with the trainer's forward: rollout/logprob_gap_* with rollout=hf, as with vLLM."""

import json

import pytest
import torch

from rlx.engines.sampling import sample_seed

QUESTIONS = ["Compute 4 + 3", "Compute 12 + 345 + 6", "What is 7?", "Compute 1 + 2 + 3 + 4 + 5"]


def _tiny():
    from rlx.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in QUESTIONS]  # different lengths: left padding in the prompt batch
    return model, tok, prompts


@pytest.mark.parametrize("knobs", [
    dict(temperature=1.0, top_p=1.0, top_k=0, batch_size=256, min_new_tokens=0),
    dict(temperature=0.7, top_p=0.9, top_k=20, batch_size=5, min_new_tokens=10),  # filters, chunks, stop mask
], ids=["plain", "filtered_chunked_forced"])
def test_decoder_logprobs_equal_the_trainers_and_leave_the_draws_alone(knobs):
    """Each sampled token's decoder log-prob is log softmax(z / T) of the trainer's forward over prompt +
    completion (HFGenerator._logprobs: the distribution before top-k/top-p and before min_new_tokens' stop mask)
    to float error, 0 past each row's end; asking for them draws the same tokens."""
    from rlx.engines.generator import HFGenerator
    from rlx.engines.hf import generate

    model, tok, prompts = _tiny()
    group = 3
    seeds = [sample_seed(3, 1, i) for i in range(len(prompts) * group)]
    plain = generate(model, tok, prompts, samples_per_prompt=group, max_new_tokens=14, seeds=seeds, **knobs)
    kept = generate(model, tok, prompts, samples_per_prompt=group, max_new_tokens=14, seeds=seeds, logprobs=True,
                    **knobs)
    assert plain.logprobs is None
    for name in ("completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(kept, name), getattr(plain, name)), name
    forward = HFGenerator(model, tok, temperature=knobs["temperature"])._logprobs(
        kept.prompt_ids, kept.prompt_mask, kept.completion_ids, kept.completion_mask)  # (N, C)
    mask = kept.completion_mask.bool()
    assert kept.logprobs.shape == kept.completion_ids.shape
    assert bool((kept.logprobs[~mask] == 0).all())
    assert bool((kept.logprobs[mask] < 0).all())
    assert torch.allclose(kept.logprobs, forward, atol=1e-4), (kept.logprobs - forward).abs().max()
    # forced positions were sampled (the tiny model stops after ~9 tokens, so EOS has real mass there and the
    # log-probs of the stop-masked distribution would differ from the trainer's by more than the tolerance)
    assert int(mask.sum()) >= len(seeds) * knobs["min_new_tokens"]


def test_generator_protocol_returns_the_decoders_logprobs():
    from rlx.engines.generator import HFGenerator

    model, tok, prompts = _tiny()
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    seeds = [sample_seed(0, 0, i) for i in range(len(ids))]
    sampler = HFGenerator(model, tok, temperature=0.8,
                          logprobs="sampler").generate_ids(ids, max_new_tokens=10, seeds=seeds)
    forward = HFGenerator(model, tok, temperature=0.8, logprobs=True).generate_ids(ids, max_new_tokens=10, seeds=seeds)
    none = HFGenerator(model, tok, temperature=0.8, logprobs=False).generate_ids(ids, max_new_tokens=10, seeds=seeds)
    assert sampler.ids == forward.ids == none.ids and none.logprobs is None
    for a, b, row in zip(sampler.logprobs, forward.logprobs, sampler.ids):
        assert len(a) == len(b) == len(row)
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    with pytest.raises(ValueError, match="logprobs must be"):
        HFGenerator(model, tok, logprobs="forward")


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_loops_log_the_gap_between_rlx_decoder_and_trainer(tmp_path, algorithm):
    """rollout=hf (the default): every step logs rollout/logprob_gap_mean and _max, at float error (the
    decoder samples with the weights the trainer's first forward of the step uses)."""
    from tests.conftest import only_run_dir, run_rlx

    extra = ["algorithm.epochs=1", "algorithm.mini_batches=1"] if algorithm == "ppo" else []
    result = run_rlx(["train", f"algorithm={algorithm}", "steps=2", "prompts_per_step=4",
                      "rollout.samples_per_prompt=4",
                      "rollout.max_new_tokens=12", "rollout.temperature=0.7", "eval.every=0", "eval.at_start=false",
                      "save.final=false", *extra], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (only_run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/logprob_gap_max" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 0 <= row["rollout/logprob_gap_mean"] <= row["rollout/logprob_gap_max"] < 1e-3, row
