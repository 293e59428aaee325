"""Direction of learning: every training loop, run for real on the shipped tiny model, must move the
model the right way on a batch whose signal is built by construction.

A wrong sign anywhere (advantage, preference pair order, value loss, reward-model margin, SFT loss)
makes these tests fail, while every smoke test (which only checks that training runs) still passes.
The rollouts are fixed (tests/loop_fixtures.FixedSampler replaces sampling), so the signal does not
depend on the tokens a particular CPU would sample, and log-probabilities are judged by an
independent forward pass (loop_fixtures.plain_logprobs), not by the loop's own batching code.

Policy-gradient and PPO runs reward LIKELY ("<answer>7</answer>") and punish UNLIKELY ("I do not
know"): the two share no tokens, so their log-prob gradients are not aligned and each moves on its own
in the direction of its advantage. (For two completions that differ in one token, "<answer>7</answer>"
vs "<answer>9</answer>", a correct update only guarantees that the margin grows: on the tiny model
lowering the "9" completion lowers the "7" one too.) Preference pairs prefer UNLIKELY over LIKELY, so
that every loss is active from the first step (SimPO and ORPO saturate on a pair whose chosen side is
already far more likely, and then any small update passes).
"""

import pytest
import torch

import rlx.build as build
from rlx.build import build_parts
from rlx.config.settings import settings as typed_settings
from rlx.engines.records import Generation
from rlx.loops import policy_gradient, ppo, preference, reward_model, sft
from rlx.models import value as value_models
from tests.loop_fixtures import (
    LIKELY,
    PROMPTS,
    UNLIKELY,
    FixedSampler,
    completion_tokens,
    components,
    loop_config,
    one_thread,  # noqa: F401 (fixture)
    pair_config,
    plain_logprobs,
    plain_score,
    render,
    rows,
    run_loop,
    scored_by,
    tiny_policy,
    tiny_scorer,
    write_pairs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

RL = ["prompts_per_step=2", "rollout.samples_per_prompt=4", "micro_batch_size=4", "optim.lr=1e-4", "steps=2"]


def _sample_logps(model, sampler: FixedSampler) -> dict:
    """{(prompt ids, completion ids): (text, summed log-prob under model)} of every distinct sample handed out."""
    seen = {(tuple(p), tuple(c)): text for p, c, text in sampler.samples}
    return {key: (text, plain_logprobs(model, list(key[0]), list(key[1])).sum().item()) for key, text in seen.items()}


def _assert_good_up_bad_down(before: dict, after: dict):
    assert set(before) == set(after) and len(before) == 4  # 2 prompts x (LIKELY, UNLIKELY)
    for key, (text, logp) in after.items():
        change = logp - before[key][1]
        if text == LIKELY:
            assert change > 0.05, f"rewarded completion lost log-prob: {change:+.3f}"
        else:
            assert change < -0.05, f"punished completion gained log-prob: {change:+.3f}"


def _run_rl(tmp_path, monkeypatch, loop, *overrides):
    model, tokenizer = tiny_policy()
    sampler = FixedSampler(tokenizer, [LIKELY, UNLIKELY])
    monkeypatch.setattr(build, "build_generator", sampler)
    cfg = loop_config(*RL, *overrides)
    parts = components(tmp_path, model, tokenizer, rows(PROMPTS[:2]), scored_by({LIKELY: 1.0, UNLIKELY: 0.0}))
    start, _ = tiny_policy()
    run_loop(loop, cfg, parts)
    assert sampler.samples, "the loop did not sample through its generator"
    return _sample_logps(start, sampler), _sample_logps(model, sampler), sampler, model, tokenizer


@pytest.mark.parametrize("preset", ["grpo", "rloo", "reinforce_pp", "dr_grpo", "gspo"])
def test_policy_gradient_raises_the_rewarded_completion(tmp_path, monkeypatch, preset):
    before, after, *_ = _run_rl(tmp_path, monkeypatch, policy_gradient.train_policy_gradient, f"algorithm={preset}")
    _assert_good_up_bad_down(before, after)


def test_policy_gradient_with_kl_and_several_updates_keeps_the_direction(tmp_path, monkeypatch):
    # old log-probs recomputed (2 epochs x 2 mini-batches), a KL penalty to a reference, micro-batches of 2
    before, after, *_ = _run_rl(tmp_path, monkeypatch, policy_gradient.train_policy_gradient, "algorithm=grpo",
                                "algorithm.kl_coef=0.05", "algorithm.epochs=2", "algorithm.mini_batches=2",
                                "micro_batch_size=2")
    _assert_good_up_bad_down(before, after)


def test_ppo_raises_the_rewarded_completion_and_its_value(tmp_path, monkeypatch):
    built = []

    def keep_value_model(*args, **kwargs):
        value_model = ppo_build(*args, **kwargs)
        built.append(value_model)
        return value_model

    ppo_build = value_models.build_value_model
    monkeypatch.setattr(value_models, "build_value_model", keep_value_model)
    before, after, sampler, *_ = _run_rl(tmp_path, monkeypatch, ppo.train_ppo, "algorithm=ppo",
                                         "algorithm.value_lr=1e-3")
    _assert_good_up_bad_down(before, after)
    # the critic starts at V = 0 everywhere; the return is 1 after LIKELY and 0 after UNLIKELY, so the values
    # of LIKELY's states must rise and end above UNLIKELY's (a flipped value loss pushes them the other way)
    value_model = built[0].eval()
    means = {}
    with torch.no_grad():
        for p, c, text in sampler.samples:
            ids, mask = torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long)
            values = value_model(ids, mask, torch.tensor([c]), torch.ones(1, len(c), dtype=torch.long))[0]  # (C,)
            means.setdefault(text, []).append(values.mean().item())
    good, bad = sum(means[LIKELY]) / len(means[LIKELY]), sum(means[UNLIKELY]) / len(means[UNLIKELY])
    assert good > 0.05 and good > bad + 0.05, (good, bad)


def _pairs_world(tmp_path, algorithm, *overrides, scorer=False):
    path = write_pairs(tmp_path / "pairs.jsonl", [(p, UNLIKELY, LIKELY) for p in PROMPTS])  # (prompt, chosen, rejected)
    cfg = pair_config(path, algorithm, "algorithm.batch_size=3", "micro_batch_size=2", *overrides)
    policy, tokenizer = tiny_policy()
    model = tiny_scorer(tokenizer) if scorer else policy
    return cfg, build_parts(typed_settings(cfg), components(tmp_path, model, tokenizer)), model, tokenizer


def _pair_logps(model, tokenizer):
    """[(chosen summed log-prob, rejected summed log-prob)] of each prompt, from a plain forward pass."""
    out = []
    for prompt in PROMPTS:
        ids = render(tokenizer, prompt)
        out.append(tuple(plain_logprobs(model, ids, completion_tokens(tokenizer, text)).sum().item()
                         for text in (UNLIKELY, LIKELY)))
    return out


@pytest.mark.parametrize("algorithm", ["dpo", "ipo", "hinge", "robust_dpo", "simpo", "orpo"])
def test_preference_step_raises_chosen_over_rejected(tmp_path, algorithm):
    cfg, parts, model, tokenizer = _pairs_world(tmp_path, algorithm, "optim.lr=1e-4", "steps=1")
    before = _pair_logps(model, tokenizer)
    preference.train_preference(parts.settings, parts)
    after = _pair_logps(model, tokenizer)
    for (c0, r0), (c1, r1) in zip(before, after):
        assert (c1 - r1) - (c0 - r0) > 1.0, f"chosen did not gain over rejected: {(c1 - r1) - (c0 - r0):+.3f}"
        assert c1 - c0 > 1.0, f"chosen did not gain: {c1 - c0:+.3f}"
    # rejected falls on the whole (not on every pair: one prompt's rejected side rises a little with chosen)
    assert sum(r1 - r0 for (_, r0), (_, r1) in zip(before, after)) < -1.0


def test_reward_model_scores_chosen_above_rejected(tmp_path):
    cfg, parts, model, tokenizer = _pairs_world(tmp_path, "reward_model", "optim.lr=1e-3", "steps=4", scorer=True)

    def margins():
        return [plain_score(model, render(tokenizer, p) + completion_tokens(tokenizer, UNLIKELY))
                - plain_score(model, render(tokenizer, p) + completion_tokens(tokenizer, LIKELY)) for p in PROMPTS]

    before = margins()
    reward_model.train_reward_model(parts.settings, parts)
    after = margins()
    assert all(m > 0.5 for m in after), (before, after)
    assert all(m1 > m0 + 0.5 for m0, m1 in zip(before, after)), (before, after)


def test_sft_raises_the_targets(tmp_path):
    model, tokenizer = tiny_policy()
    data = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ["7", "12", "3"])]
    cfg = loop_config("algorithm=sft", "algorithm.batch_size=3", "micro_batch_size=2", "optim.lr=1e-4", "steps=2")

    def target_nll():  # token-mean NLL of the three targets, the quantity SFT minimises
        logps = [plain_logprobs(model, render(tokenizer, row["prompt"]),
                                completion_tokens(tokenizer, f"<answer>{row['answer']}</answer>")) for row in data]
        return -torch.cat(logps).mean().item()

    before = target_nll()
    run_loop(sft.train_sft, cfg, components(tmp_path, model, tokenizer, data))
    after = target_nll()
    assert after < before - 0.05, (before, after)  # 0.49 -> 0.33 nats per token on the machine that wrote this


class JudgedAction:
    """One-turn environment (gymnasium shape) that pays 1 when the action holds the LIKELY completion's text."""

    def reset(self, *, seed=None, options=None):
        return "Say the answer.", {}

    def step(self, action):
        win = float(LIKELY in action)
        return "done", win, True, False, {"metrics": {"success": win}}


class AlternatingSampler(FixedSampler):
    """FixedSampler whose k-th row handed out (over all calls) is completions[k % 2]: the episodes of every
    group alternate between the two actions, so their rewards differ by construction. The multi-turn rollout
    keeps sampling log-probs: the policy's own, from one plain forward pass."""

    def generate_ids(self, prompts, **_):
        batch = []
        for ids in prompts:
            text = self.completions[len(self.samples) % len(self.completions)]
            self.samples.append((list(ids), completion_tokens(self.tokenizer, text), text))
            batch.append(self.samples[-1])
        logprobs = [plain_logprobs(self.model, p, c).tolist() for p, c, _ in batch]
        return Generation([b[1] for b in batch], logprobs, [True] * len(batch))


@pytest.mark.parametrize("algorithm", ["agent_grpo", "gigpo"])
def test_agent_loop_raises_the_rewarded_action(tmp_path, monkeypatch, algorithm):
    model, tokenizer = tiny_policy()
    sampler = AlternatingSampler(tokenizer, [LIKELY, UNLIKELY])
    monkeypatch.setattr(build, "build_generator", sampler)
    cfg = loop_config(f"algorithm={algorithm}", "env=custom", "env.target=tests.test_direction.JudgedAction",
                      "env.eval_episodes=1", *RL)
    start, _ = tiny_policy()
    run_loop(policy_gradient.train_policy_gradient, cfg, components(tmp_path, model, tokenizer))
    before, after = _sample_logps(start, sampler), _sample_logps(model, sampler)
    assert {text for text, _ in before.values()} == {LIKELY, UNLIKELY}
    for key, (text, logp) in after.items():
        change = logp - before[key][1]
        assert (change > 0.05) if text == LIKELY else (change < -0.05), f"{text}: {change:+.3f}"
