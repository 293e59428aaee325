"""One policy-gradient update for single-turn rows and episodes (issue 26): the agent family runs the same update
as GRPO, so the sampling temperature, packing, token budgets and the KL term hold for episodes too.

The world is tests/test_direction.py's: a one-turn environment (JudgedAction) that pays 1 for the LIKELY
completion, played by a sampler that alternates the two fixed completions, so every group has a reward
difference by construction."""

from __future__ import annotations

import pytest
import torch

import rlx.build as build
from rlx.config.overrides import check_overrides
from rlx.config.rules import check_settings
from rlx.config.settings import checked_settings
from rlx.errors import UserError
from rlx.loops import policy_gradient
from rlx.runtime.rundir import read_metrics
from tests.loop_fixtures import (
    LIKELY,
    UNLIKELY,
    components,
    loop_config,
    one_thread,  # noqa: F401 (fixture)
    run_loop,
    tiny_policy,
)
from tests.test_direction import AlternatingSampler
from tests.test_golden_losses import perturbed_copy

pytestmark = pytest.mark.usefixtures("one_thread")

AGENT = ["algorithm=agent_grpo", "env=custom", "env.target=tests.test_direction.JudgedAction", "env.eval_episodes=1",
         "prompts_per_step=2", "rollout.samples_per_prompt=4", "micro_batch_size=4", "steps=1"]


def _run(tmp_path, monkeypatch, *overrides, reference=None):
    model, tokenizer = tiny_policy()
    sampler = AlternatingSampler(tokenizer, [LIKELY, UNLIKELY])
    monkeypatch.setattr(build, "build_generator", sampler)
    if reference is not None:
        monkeypatch.setattr(build.lora, "reference_model", lambda policy: reference(policy))
    cfg = loop_config(*AGENT, *overrides)
    run_loop(policy_gradient.train_policy_gradient, cfg, components(tmp_path, model, tokenizer))
    (row,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1]
    return row, sampler, model


@torch.no_grad()
def _tempered_logprobs(model, prompt_ids, completion_ids, temperature):
    """log softmax(z / T) of each completion token from one unpadded forward pass, (len(c),) float64."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].double() / temperature  # (C, V)
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("extra", [[], ["packed_forward=true"], ["micro_batch_tokens=64"]],
                         ids=["padded", "packed", "token-budget"])
def test_agent_update_loss_matches_the_formula_at_the_sampling_temperature(tmp_path, monkeypatch, extra):
    """Trajectory GRPO over episodes, one optimizer step per batch (ratio exactly 1), token-mean, with a KL
    penalty (k3, Schulman 2020) to a reference; every log-prob at the sampling temperature T = 0.7:
        A_i = (R_i - mean_g R) / (std_g R + 1e-6)          (episodes of one environment seed form a group)
        loss = sum_i sum_t [ -A_i + beta (exp(r_it - l_it) - (r_it - l_it) - 1) ] / sum_i |o_i|
    with l_it = log softmax(z_t / T) of the policy, r_it the reference's. Here the groups alternate LIKELY (R 1)
    and UNLIKELY (R 0): A = +-(0.5 / std), std of (1, 0, 1, 0) = 0.5774. Padded, packed and token-budget
    micro-batches give the same number (the agent loop ignored the last two before issue 26, and took both
    log-probs at T = 1)."""
    references = []

    def reference_of(policy):
        references.append(perturbed_copy(policy))
        return references[-1]

    row, sampler, model = _run(tmp_path, monkeypatch, "rollout.temperature=0.7", "algorithm.kl_coef=0.1",
                               "optim.lr=0", *extra, reference=reference_of)
    samples = sampler.samples[:8]  # the training episodes (evaluation plays after them)
    beta, temperature = 0.1, 0.7
    total, tokens = 0.0, 0
    std = torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item()
    for p, c, text in samples:
        advantage = (1.0 - 0.5) / (std + 1e-6) if text == LIKELY else (0.0 - 0.5) / (std + 1e-6)
        logp = _tempered_logprobs(model, p, c, temperature)
        ref = _tempered_logprobs(references[0], p, c, temperature)
        d = ref - logp
        total += float((-advantage + beta * (torch.exp(d) - d - 1)).sum())
        tokens += len(c)
    assert row["train/loss"] == pytest.approx(total / tokens, rel=1e-5, abs=1e-6)


def test_agent_ratio_is_one_before_the_first_update_at_any_temperature(tmp_path, monkeypatch):
    """The old log-probs are the trainer's at the sampling temperature, so with lr = 0 every ratio of every epoch
    is 1: no clipping and no approximate KL. Before issue 26 the agent loop took the sampler's log-probs as the
    old ones and its own at T = 1: clip_frac 0.011 on the first step at rollout.temperature=0.7."""
    row, _, _ = _run(tmp_path, monkeypatch, "rollout.temperature=0.7", "algorithm.epochs=2", "optim.lr=0")
    assert row["train/clip_frac"] == 0.0
    assert abs(row["train/approx_kl"]) < 1e-6
    assert row["train/update_skipped"] == 0.0


def test_agent_batch_with_no_signal_takes_no_step_without_a_scheduler_warning(tmp_path, monkeypatch, recwarn):
    """Every episode wins (the sampler always says LIKELY): all advantages are 0, so algorithm.skip_zero_advantage
    (on for the agent family) takes no optimizer step, and stepping the schedule alone warns nothing."""
    model, tokenizer = tiny_policy()
    sampler = AlternatingSampler(tokenizer, [LIKELY])
    monkeypatch.setattr(build, "build_generator", sampler)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = loop_config(*AGENT, "steps=2")
    run_loop(policy_gradient.train_policy_gradient, cfg, components(tmp_path, model, tokenizer))
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] >= 1]
    assert [r["train/update_skipped"] for r in rows] == [1.0, 1.0]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]


def test_an_environment_without_an_agent_algorithm_is_refused():
    """`env=` means episodes: a family that does not play them refuses it in one line (issue 26; it used to train
    GRPO on the default task and ignore the environment)."""
    cfg = check_overrides(["env=custom", "env.target=tests.test_direction.JudgedAction"])
    with pytest.raises(UserError, match=r"env=custom trains on episodes .*algorithm=agent_grpo"):
        check_settings(checked_settings(cfg))
    check_settings(checked_settings(check_overrides(["algorithm=agent_grpo", "env=custom",
                                                     "env.target=tests.test_direction.JudgedAction"])))
