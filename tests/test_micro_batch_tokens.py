"""Token-budget micro-batches (micro_batch_tokens) and rows grouped by length (micro_batch_split=lengths): the plans by
hand, and the same gradients as the fixed-count path in the real policy-gradient and PPO loops (the loss normalisers
are those of the whole mini-batch)."""

import pytest
import torch

import rlx.build as build
from rlx.build import build_parts
from rlx.config.settings import checked_settings
from rlx.config.settings import settings as typed_settings
from rlx.loops import micro_batches, policy_gradient, ppo
from rlx.loops.micro_batches import (
    MicroBatching,
    length_split,
    plan_micro_batches,
    split_to_count,
    token_budget_split,
)
from tests.loop_fixtures import (
    LIKELY,
    MID,
    PROMPTS,
    UNLIKELY,
    FixedSampler,
    components,
    loop_config,
    one_thread,  # noqa: F401 (fixture)
    rows,
    scored_by,
    tiny_policy,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_token_budget_split_by_hand():
    # (prompt, completion) lengths; cost of a run = rows x (max prompt + max completion), budget 30
    # rows 0-1: 2 x (10 + 5) = 30 fits; + row 2: 3 x (10 + 12) = 66 > 30 -> new run
    # row 2 alone 22; + row 3: 2 x (10 + 12) = 44 > 30 -> new run; row 3 (8 + 40 = 48) exceeds alone: own run
    # row 4: 1 x (5 + 5) = 10; + row 5: 2 x (5 + 9) = 28 fits
    prompts, completions = [10, 10, 10, 8, 5, 5], [5, 3, 12, 40, 5, 9]
    assert token_budget_split(prompts, completions, 30) == [[0, 1], [2], [3], [4, 5]]
    assert token_budget_split(prompts, completions, 1000) == [[0, 1, 2, 3, 4, 5]]
    # to 6 runs: the costliest splittable run is split in halves first ([0, 1] costs 30, [4, 5] 28)
    cost = lambda run: len(run) * (max(prompts[i] for i in run) + max(completions[i] for i in run))  # noqa: E731
    assert split_to_count([[0, 1], [2], [3], [4, 5]], 5, cost) == [[0], [1], [2], [3], [4, 5]]
    with pytest.raises(ValueError):
        split_to_count([[0], [1]], 3, cost)


def test_plan_keeps_the_fixed_count_path_and_maps_indices():
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]])
    completion_mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    mini = torch.tensor([3, 0, 2, 1])
    fixed = plan_micro_batches(mini, prompt_mask, completion_mask, MicroBatching(3, None, "rows", 0))
    assert [m.tolist() for m in fixed] == [[3, 0, 2], [1]]
    # lengths in mini order: prompts [3, 2, 1, 3], completions [2, 2, 4, 1]; budget 10:
    # [3, 0] = 2 x (3 + 2) = 10; + row 2: 3 x (3 + 4) > 10; [2, 1] = 2 x (3 + 4) = 14 > 10 -> split
    budget = MicroBatching(3, 10, "lengths", 0)  # a token budget wins over the split
    planned = plan_micro_batches(mini, prompt_mask, completion_mask, budget)
    assert [m.tolist() for m in planned] == [[3, 0], [2], [1]]
    agreed = plan_micro_batches(mini, prompt_mask, completion_mask, budget, count_all=lambda n: 4)
    assert [m.tolist() for m in agreed] == [[3], [0], [2], [1]]
    # grouped by length, overhead 2: sorted by (completion, prompt): positions 3 (1+3), 1 (2+2), 0 (2+3), 2 (4+1);
    # [3, 1, 0] costs 3 x (3 + 2) = 15 + 2 and [2] 1 x (1 + 4) = 5 + 2: 24, below one run (4 x 7 + 2 = 30)
    by_length = plan_micro_batches(mini, prompt_mask, completion_mask, MicroBatching(3, None, "lengths", 2))
    assert [m.tolist() for m in by_length] == [[3, 0, 1], [2]]


def test_length_split_by_hand():
    # prompts 10 each; completions 100, 5, 90, 6: sorted 1 (5), 3 (6), 2 (90), 0 (100)
    prompts, completions = [10, 10, 10, 10], [100, 5, 90, 6]
    # overhead 0: singles 15 + 16 + 100 + 110 = 241, below [1, 3] + [2, 0] = 2 x 16 + 2 x 110 = 252 and all four 440
    assert length_split(prompts, completions, 4, 0) == [[0], [1], [2], [3]]
    # overhead 20: singles 241 + 80 = 321; [1, 3] + [2, 0] = 252 + 40 = 292; [1, 3] + [2] + [0] = 32 + 100 + 110
    # + 60 = 302; all four 440 + 20 = 460: two runs, each in ascending positions
    assert length_split(prompts, completions, 4, 20) == [[0, 2], [1, 3]]
    # overhead 1000: one run is cheapest (440 + 1000 against 252 + 2000), unless max_rows forbids it
    assert length_split(prompts, completions, 4, 1000) == [[0, 1, 2, 3]]
    assert length_split(prompts, completions, 2, 1000) == [[0, 2], [1, 3]]


def test_the_length_split_is_refused_where_the_count_is_fixed():
    from rlx.config.overrides import check_overrides
    from rlx.config.rules import check_batch
    from rlx.errors import UserError

    assert MicroBatching.of(checked_settings(check_overrides([])), 10**6).split == "rows"
    assert MicroBatching.of(checked_settings(check_overrides([])), 10**6).overhead == 32 + 4000
    with pytest.raises(UserError, match="micro_batch_split=lengths"):
        check_batch(checked_settings(check_overrides(["hardware=deepspeed_zero2", "micro_batch_split=lengths"])), 1)


# 2 prompts x 3 samples = 6 sequences; one fixed-count micro-batch vs several token-budget ones
RL = ["prompts_per_step=2", "rollout.samples_per_prompt=3", "optim.lr=0", "steps=1", "algorithm.epochs=1",
      "algorithm.mini_batches=1", "optim.max_grad_norm=null"]


def _run(loop, tmp_path, monkeypatch, *overrides, accumulation=1):
    """Gradients each optimizer step saw (policy, then the critic for PPO) and the micro-batch sizes used."""
    tmp_path.mkdir()
    model, tokenizer = tiny_policy()
    sampler = FixedSampler(tokenizer, [LIKELY, UNLIKELY, MID])
    module = {"pg": policy_gradient, "ppo": ppo}[loop]
    grads, sizes = [], []
    real_step, real_plan = module.optimizer_step, micro_batches.plan_micro_batches

    def recording_step(acc, net, *args):
        grads.append({n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None})
        return real_step(acc, net, *args)

    def recording_plan(*args):
        plan = real_plan(*args)
        sizes.append([len(m) for m in plan])
        return plan

    with monkeypatch.context() as patch:
        patch.setattr(build, "build_generator", sampler)
        patch.setattr(module, "optimizer_step", recording_step)
        patch.setattr(module, "plan_micro_batches", recording_plan)
        cfg = loop_config(*RL, *overrides)
        train = policy_gradient.train_policy_gradient if loop == "pg" else ppo.train_ppo
        parts = build_parts(typed_settings(cfg),
                            components(tmp_path, model, tokenizer, rows(PROMPTS[:2]), scored_by(REWARDS)))
        parts.accelerator.gradient_accumulation_steps = accumulation  # what train.py derives from micro_batch_size
        train(parts.settings, parts)
    return grads, sizes


REWARDS = {LIKELY: 1.0, UNLIKELY: 0.0, MID: 0.5}


@pytest.mark.parametrize("loop,overrides", [
    ("pg", ["algorithm=grpo"]),
    ("pg", ["algorithm=grpo", "algorithm.loss_agg=seq-mean-token-mean"]),
    ("ppo", ["algorithm=ppo"]),
])
def test_token_budget_gives_the_fixed_count_gradients(tmp_path, monkeypatch, loop, overrides):
    fixed, fixed_sizes = _run(loop, tmp_path / "fixed", monkeypatch, *overrides, "micro_batch_size=6",
                              "micro_batch_split=rows")
    # accumulation 2 as train.py would set for micro_batch_size=3: the loop must use its own plan's count
    budget, budget_sizes = _run(loop, tmp_path / "budget", monkeypatch, *overrides, "micro_batch_tokens=60",
                                accumulation=2)
    # the budget split the batch (2 prompts of ~25 tokens, completions of 5-9): 5 micro-batches, not a multiple of 2
    assert fixed_sizes == [[6]] and budget_sizes == [[1, 1, 2, 1, 1]]
    assert len(fixed) == len(budget) and fixed
    for want, got in zip(fixed, budget):
        assert want.keys() == got.keys()
        for name in want:
            error = (got[name] - want[name]).norm() / want[name].norm().clamp(min=1e-12)
            assert error < 1e-4, (name, error.item())  # float rounding of a different summation order only


@pytest.mark.parametrize("loop,overrides", [("pg", ["algorithm=grpo"]), ("ppo", ["algorithm=ppo"])])
def test_rows_grouped_by_length_give_the_fixed_count_gradients(tmp_path, monkeypatch, loop, overrides):
    fixed, fixed_sizes = _run(loop, tmp_path / "fixed", monkeypatch, *overrides, "micro_batch_size=6",
                              "micro_batch_split=rows")
    grouped, grouped_sizes = _run(loop, tmp_path / "grouped", monkeypatch, *overrides, "micro_batch_size=6",
                                  "micro_batch_split=lengths", "micro_batch_overhead=0", accumulation=1)
    assert fixed_sizes == [[6]] and len(grouped_sizes[0]) > 1  # completions of 5-9 tokens: split by length
    for want, got in zip(fixed, grouped, strict=True):
        for name in want:
            error = (got[name] - want[name]).norm() / want[name].norm().clamp(min=1e-12)
            assert error < 1e-4, (name, error.item())


def test_token_budget_is_refused_under_deepspeed():
    """DeepSpeed's engine fixes the micro-batch count per step: one line naming the fix, at start-up."""
    from rlx.config.overrides import check_overrides
    from rlx.config.rules import check_batch
    from rlx.errors import UserError

    check_batch(checked_settings(check_overrides(["micro_batch_tokens=512"])), 1)
    with pytest.raises(UserError, match="micro_batch_tokens"):
        check_batch(checked_settings(check_overrides(["hardware=deepspeed_zero2", "micro_batch_tokens=512"])), 1)
