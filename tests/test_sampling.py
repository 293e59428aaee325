"""Seeded per-row sampling: exact distribution on hand fixtures, and independence from batching."""

import math

import torch

from rlx.engines.sampling import filtered_probs, inverse_cdf_sample, row_uniforms, sample_seed


def test_inverse_cdf_hand_values():
    probs = torch.tensor([[0.2, 0.5, 0.3]] * 4, dtype=torch.float64)
    # CDF = [0.2, 0.7, 1.0]: u=0.1 -> 0, u=0.2 -> 1 (bins are [lo, hi)), u=0.69 -> 1, u=0.99 -> 2
    u = torch.tensor([0.1, 0.2, 0.69, 0.99], dtype=torch.float64)
    assert inverse_cdf_sample(probs, u).tolist() == [0, 1, 1, 2]
    # zero-probability tokens are never drawn
    zero = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    assert inverse_cdf_sample(zero, torch.tensor([0.0], dtype=torch.float64)).item() == 1


def test_filters_temperature_topk_topp():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(filtered_probs(logits, 1.0, 0, 1.0),
                          torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    # top-k 2 keeps 0.5, 0.3 -> renormalised [0.625, 0.375]
    assert torch.allclose(filtered_probs(logits, 1.0, 2, 1.0)[0, :2], torch.tensor([0.625, 0.375], dtype=torch.float64))
    # top-p 0.7: mass before token 1 is 0.5 < 0.7 (kept), before token 2 is 0.8 (dropped)
    assert torch.allclose(filtered_probs(logits, 1.0, 0, 0.7)[0],
                          torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    # temperature 0.5 squares the probabilities before renormalising
    sq = torch.tensor([0.25, 0.09, 0.0225, 0.0025], dtype=torch.float64)
    assert torch.allclose(filtered_probs(logits, 0.5, 0, 1.0)[0], sq / sq.sum())


def test_uniforms_are_uniform_and_row_local():
    seeds = torch.tensor([sample_seed(0, 1, i) for i in range(4000)])
    u = row_uniforms(seeds, position=3)
    assert 0.0 < u.min() and u.max() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.02 and abs(u.var().item() - 1 / 12) < 0.01
    # a row's uniform does not depend on which other rows share the batch
    assert torch.equal(row_uniforms(seeds[7:9], 3), u[7:9])
    assert row_uniforms(seeds[:1], 4).item() != u[0].item()
    assert len({sample_seed(s, t, i) for s in range(3) for t in range(3) for i in range(50)}) == 450


def test_empirical_frequencies_match_probs():
    probs = torch.tensor([[0.1, 0.6, 0.3]], dtype=torch.float64).repeat(6000, 1)
    seeds = torch.tensor([sample_seed(1, 0, i) for i in range(6000)])
    tokens = inverse_cdf_sample(probs, row_uniforms(seeds, 0))
    freq = torch.bincount(tokens, minlength=3).double() / 6000
    assert torch.allclose(freq, probs[0], atol=3 * math.sqrt(0.25 / 6000) + 0.005)


def test_generate_is_independent_of_chunking():
    from rlx.engines.hf import generate
    from rlx.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Compute {a} + 3"}], tokenize=False,
                                       add_generation_prompt=True) for a in range(3)]
    seeds = [sample_seed(0, 0, i) for i in range(6)]
    whole = generate(model, tok, prompts, samples_per_prompt=2, max_new_tokens=8, seeds=seeds, batch_size=6)
    chunked = generate(model, tok, prompts, samples_per_prompt=2, max_new_tokens=8, seeds=seeds, batch_size=2)
    assert whole.texts == chunked.texts
    shard = generate(model, tok, prompts[1:2], samples_per_prompt=2, max_new_tokens=8, seeds=seeds[2:4])
    assert shard.texts == whole.texts[2:4]


def test_python_and_tensor_hash_agree():
    from rlx.engines.sampling import _mix32, _mix32_int

    values = [0, 1, 12345, 2**32 - 1, 987654321]
    assert _mix32(torch.tensor(values)).tolist() == [_mix32_int(v) for v in values]


def test_blocked_inverse_cdf_matches_full_cdf():
    from rlx.engines.sampling import blocked_inverse_cdf_sample

    # weights [1, 0, 3, 4] (total 8) in blocks of 3: CDF [1, 1, 4, 8] / 8 = [.125, .125, .5, 1]
    weights = torch.tensor([[1.0, 0.0, 3.0, 4.0]] * 5)
    u = torch.tensor([0.1, 0.125, 0.49, 0.5, 0.999], dtype=torch.float64)
    assert blocked_inverse_cdf_sample(weights, u, block=3).tolist() == [0, 2, 2, 3, 3]
    # agrees with the one-level sampler on random weights with zeros, and never draws a zero weight
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(200, 50, generator=g) * (torch.rand(200, 50, generator=g) > 0.3)
    weights[:, 0] += 0.01
    u = torch.rand(200, generator=g, dtype=torch.float64)
    blocked = blocked_inverse_cdf_sample(weights, u, block=7)
    assert torch.equal(blocked, inverse_cdf_sample(weights.double() / weights.double().sum(-1, keepdim=True), u))
    assert (weights.gather(1, blocked[:, None]) > 0).all()


def test_nucleus_sample_hand_values():
    """Sampler v2: the CDF runs over the kept tokens in descending-probability order.
    p = [0.05, 0.3, 0.5, 0.15] -> sorted ids [2, 1, 3, 0] with P = [0.5, 0.8, 0.95, 1.0]."""
    from rlx.engines.sampling import nucleus_sample

    logits = torch.log(torch.tensor([[0.05, 0.3, 0.5, 0.15]])).repeat(4, 1)
    u = torch.tensor([0.1, 0.62, 0.63, 0.999], dtype=torch.float64)
    # top-p 0.7: mass before id 1 is 0.5 < 0.7 (kept), before id 3 is 0.8 (dropped): M = 0.8, Q = [0.5, 0.8]
    # u * M = 0.08 -> id 2; 0.496 -> id 2; 0.504 -> id 1; 0.7992 -> id 1
    assert nucleus_sample(logits, u, 1.0, 0, 0.7).tolist() == [2, 2, 1, 1]
    # top-k 3: Q = [0.5, 0.8, 0.95] / 0.95 = [0.526, 0.842, 1]: u 0.1 -> 2, 0.62 -> 1, 0.999 -> 3
    assert nucleus_sample(logits, u, 1.0, 3, 1.0).tolist() == [2, 1, 1, 3]
    # candidates=1: the nucleus is not inside the first sorted token, the rows are redone with all of them
    assert nucleus_sample(logits, u, 1.0, 0, 0.7, candidates=1).tolist() == [2, 2, 1, 1]
    # temperature 0.5 squares p: [0.0025, 0.09, 0.25, 0.0225] / 0.365; top-p 0.5 keeps id 2 alone (0.685 >= 0.5)
    assert nucleus_sample(logits, u, 0.5, 0, 0.5).tolist() == [2, 2, 2, 2]


def test_nucleus_sample_matches_filtered_distribution_and_is_row_local():
    """v2 draws from the same filtered distribution as v1 (frequencies), a row's draw depends only on its own
    row (alone vs batched, flat rows that need the whole vocabulary sorted mixed with peaked ones), and the
    candidates count changes nothing."""
    from rlx.engines.sampling import nucleus_sample, sample_tokens

    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 300, generator=g) * 2
    n = 6000
    seeds = torch.tensor([sample_seed(3, 0, i) for i in range(n)])
    for top_k, top_p in ((0, 0.8), (20, 1.0), (20, 0.6)):
        tokens = sample_tokens(base.repeat(n, 1), seeds, 0, 0.9, top_k, top_p, sampler="v2")
        want = filtered_probs(base, 0.9, top_k, top_p)[0]
        freq = torch.bincount(tokens, minlength=300).double() / n
        assert (want[tokens] > 0).all()  # never outside the nucleus
        assert (freq - want).abs().max() < 0.025
    logits = torch.randn(12, 3000, generator=g) * torch.tensor([0.1, 8.0] * 6).unsqueeze(1)  # flat and peaked rows
    u = torch.rand(12, generator=g, dtype=torch.float64)
    batched = nucleus_sample(logits, u, 1.0, 0, 0.9, candidates=16)
    alone = torch.cat([nucleus_sample(logits[i : i + 1], u[i : i + 1], 1.0, 0, 0.9, candidates=16) for i in range(12)])
    assert torch.equal(batched, alone)
    assert torch.equal(batched, nucleus_sample(logits, u, 1.0, 0, 0.9, candidates=3000))


def test_sampler_versions_agree_without_filters_and_are_registered():
    from rlx.engines.sampling import LEGACY_SAMPLER, SAMPLERS, sample_tokens

    assert set(SAMPLERS) == {"v1", "v2", "v3"} and LEGACY_SAMPLER == "v1"
    g = torch.Generator().manual_seed(1)
    logits, seeds = torch.randn(16, 2000, generator=g), torch.arange(16)
    assert torch.equal(sample_tokens(logits, seeds, 5, 0.8, 0, 1.0, sampler="v1"),
                       sample_tokens(logits, seeds, 5, 0.8, 0, 1.0, sampler="v2"))


def test_resume_pins_the_legacy_sampler(tmp_path):
    """A run whose config.yaml predates rollout.sampler resumes with v1 (what it drew with); a run that
    recorded its version, or a resume that sets it, gets no pin."""
    from rlx.runtime.launch import legacy_pins

    (tmp_path / "config.yaml").write_text("rollout:\n  temperature: 1.0\n")
    assert legacy_pins(tmp_path, set()) == ["++rollout.sampler=v1"]
    assert legacy_pins(tmp_path, {"rollout.sampler"}) == []
    (tmp_path / "config.yaml").write_text("rollout:\n  sampler: v2\n")
    assert legacy_pins(tmp_path, set()) == []
    (tmp_path / "config.yaml").write_text("name: sft\n")  # no rollout at all: nothing to pin
    assert legacy_pins(tmp_path, set()) == []


def test_single_turn_sampling_through_the_generator_protocol_draws_what_generate_draws():
    """rollout/single_turn.py samples through HFGenerator.generate_ids (token ids in, ids out) and builds the Rollout
    from the ids: every tensor and text must equal the old text path (rlx.engines.hf.generate on the rendered
    prompts) token for token, for the same seeds, knobs, chunking and min_new_tokens."""
    from rlx.engines.generator import Draw, HFGenerator, sample_rollout
    from rlx.engines.hf import generate
    from rlx.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer("builtin:tiny"), load_causal_lm("builtin:tiny")
    questions = ["Compute 4 + 3", "Compute 12 + 345 + 6", "What is 7?", "Compute 1 + 2 + 3 + 4 + 5"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in questions]
    settings = [dict(temperature=1.0, top_p=1.0, top_k=0, batch_size=256, min_new_tokens=0, greedy=False),
                dict(temperature=0.7, top_p=0.9, top_k=20, batch_size=5, min_new_tokens=10, greedy=False),
                dict(temperature=1.0, top_p=1.0, top_k=0, batch_size=4, min_new_tokens=0, greedy=True)]
    endings = []
    for knobs in settings:
        group = 3
        seeds = [sample_seed(5, 2, i) for i in range(len(prompts) * group)]
        old = generate(model, tok, prompts, samples_per_prompt=group, max_new_tokens=12, seeds=seeds, **knobs)
        generator = HFGenerator(model, tok, temperature=knobs["temperature"], top_p=knobs["top_p"],
                                top_k=knobs["top_k"], batch_size=knobs["batch_size"], logprobs=False)
        new = sample_rollout(generator, tok, prompts, Draw(group, 12, greedy=knobs["greedy"],
                                                           min_new_tokens=knobs["min_new_tokens"]), seeds)
        for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
            assert torch.equal(getattr(new, name), getattr(old, name)), (name, knobs)
        assert new.texts == old.texts and new.logprobs is None and old.logprobs is None
        assert bool((old.lengths >= knobs["min_new_tokens"]).all())  # the tiny model stops after ~9 tokens unforced
        endings += old.truncated.tolist()
    assert any(endings) and not all(endings)  # rows that stopped and rows that ran out of budget
