"""Seed ideas on the rollout side (issue 29): EAD's per-token temperature, the hints stage's choice of all-fail
groups and the ratio of a hinted row. Hand-derived numbers in the docstrings."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlx.algorithms.losses import clipped_surrogate
from rlx.rollout.stages.hints import Hints, hint_fraction, hint_prefix, hinted_message, reference_solution
from rlx.rollout.stages.temperature import (
    TEMPERATURE_SCHEDULES,
    ead_decay,
    hot_tokens,
    temperature_schedule,
    tempered_logprobs,
)

T = torch.tensor


def close(actual, expected, tol=1e-5):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64),
                          atol=tol)


# --------------------------------------------------------------------------------------------------
# 7. EAD
# --------------------------------------------------------------------------------------------------


def test_ead_schedule_by_hand():
    """tau_t = max(1 + 1.2 - e^(t / d), 0.1). Step 0, d_0 = 10: t=0 -> 2.2 - 1 = 1.2; t=1 -> 2.2 - e^0.1 =
    1.094829; t=5 -> 2.2 - e^0.5 = 0.551279; t=20 -> 2.2 - e^2 < 0.1 -> 0.1.
    Step 2: d = 10 + 5 x 2 = 20: t=5 -> 2.2 - e^0.25 = 0.915975. Warm-up c = 2 at base 1.0: t = 0, 1 -> 1."""
    knobs = {"tau_max": 1.2, "tau_min": 0.1, "decay_d0": 10.0}
    positions = T([0, 1, 5, 20])
    assert close(TEMPERATURE_SCHEDULES["ead"](positions, 0, 1.0, **knobs), [1.2, 1.094829, 0.551279, 0.1])
    assert close(TEMPERATURE_SCHEDULES["ead"](T([5]), 2, 1.0, **knobs), [0.915975])
    assert close(TEMPERATURE_SCHEDULES["ead"](positions, 0, 1.0, warmup_tokens=2, **knobs), [1.0, 1.0, 0.551279, 0.1])
    assert ead_decay(10**9, 10.0) == 40000.0 and ead_decay(3, 10.0) == 25.0
    assert close(temperature_schedule("constant", 3, 7, 0.7), [0.7, 0.7, 0.7])


def test_ead_cools_within_a_generation_and_stays_hot_longer_as_training_goes_on():
    early = temperature_schedule("ead", 40, 0, 1.0, {"decay_d0": 20.0})
    late = temperature_schedule("ead", 40, 100, 1.0, {"decay_d0": 20.0})
    assert (early[1:] <= early[:-1]).all() and early[0] == pytest.approx(1.2) and early[-1] == pytest.approx(0.1)
    assert (late >= early).all() and (late > early).any()
    assert hot_tokens(1.2, 0.1, 20.0) == 15 and early[14] > 0.1 and early[15] == pytest.approx(0.1)  # 20 ln 2.1 = 14.8


def test_tempered_logprobs_use_each_positions_temperature():
    """Logits [0, ln 3], sampled token 1. tau 1: p = 3/4 -> ln 0.75 = -0.287682; tau 0.5: logits x 2 ->
    p = 9/10 -> -0.105361; tau 2: logits / 2 -> p = sqrt3 / (1 + sqrt3) = 0.633975 -> -0.455746."""
    logits = T([[0.0, math.log(3.0)]]).expand(3, 2).unsqueeze(0)  # (N=1, T=3, V=2)
    tokens = T([[1, 1, 1]])
    expected = [[-0.287682, -0.105361, -0.455746]]
    assert close(tempered_logprobs(logits, tokens, T([1.0, 0.5, 2.0])), expected)
    assert close(tempered_logprobs(logits, tokens, T([[1.0, 0.5, 2.0]])), expected)  # (N, T) form


# --------------------------------------------------------------------------------------------------
# 3. Hints
# --------------------------------------------------------------------------------------------------


def test_hint_fraction_anneals_linearly():
    """0.8 -> 0.2 over 100 steps: step 50 -> 0.8 - 0.6 x 0.5 = 0.5; from step 100 on: 0.2; anneal 0: 0.2."""
    assert [hint_fraction(s, 0.8, 0.2, 100) for s in (0, 50, 100, 150)] == pytest.approx([0.8, 0.5, 0.2, 0.2])
    assert hint_fraction(3, 0.8, 0.2, 0) == 0.2


def test_hint_is_a_prefix_of_the_reference_and_rows_without_one_are_left_alone():
    """10 tokens: fraction 0.25 -> ceil(2.5) = 3 tokens; 0.01 -> at least 1; 1.0 -> all 10; 0 -> no hint."""
    assert hint_prefix(list(range(10)), 0.25) == [0, 1, 2] and hint_prefix(list(range(10)), 0.01) == [0]
    assert hint_prefix(list(range(10)), 1.0) == list(range(10))
    assert hint_prefix(list(range(10)), 0.0) is None and hint_prefix([], 0.5) is None and hint_prefix(None, 0.5) is None
    template = "<answer>{answer}</answer>"
    assert reference_solution({"answer": "12"}, "answer", completion_template=template) == "<answer>12</answer>"
    assert reference_solution({"question": "?"}, "answer", completion_template=template) is None
    assert reference_solution({"solution": "  "}, "column", column="solution") is None
    assert reference_solution({"solution": "3 + 4 = 7"}, "column", column="solution") == "3 + 4 = 7"
    assert hinted_message("What is 3+4?", "<answer>", "{prompt}\nHint: {hint}") == "What is 3+4?\nHint: <answer>"
    with pytest.raises(ValueError, match="valid choices: column, answer"):
        reference_solution({}, "teacher")


def test_the_stage_hints_only_all_fail_groups_with_a_usable_hint():
    """Groups [0, 0 | 1, 1 | 2, 2]: group 0 failed entirely and its row has an answer -> hinted, from its first row,
    with the first ceil(0.5 x 19) = 10 characters of "<answer>12</answer>" (a tokenizer of one id per character);
    group 1 has a correct sample -> not; group 2 failed but its row has no answer -> left alone, yet counted among
    the all-fail groups (2 of them)."""
    hints = SimpleNamespace(source="answer", column=None)
    part = SimpleNamespace(correct=T([False, False, True, False, False, False]), groups=T([0, 0, 1, 1, 2, 2]),
                           rows=[{"answer": "12"}] * 4 + [{"question": "?"}] * 2)
    ctx = SimpleNamespace(completion_template="<answer>{answer}</answer>",
                          tokenizer=lambda text, add_special_tokens: {"input_ids": [ord(c) for c in text]})
    chosen, all_fail = Hints(hints, "accuracy").chosen_groups(part, ctx, 0.5)
    assert all_fail == 2
    assert chosen == [(0, 0, [ord(c) for c in "<answer>12"])]


def test_a_hinted_success_raises_the_no_hint_probability():
    """Direction: a tabular policy whose logits depend on the prompt's last token (plain prompt ends in 6,
    hinted prompt in 8; separate logits). The hinted sample drew token 1 and succeeded (A = +1). With the
    ratio's numerator taken in the plain prompt (the training row's; the hinted one is Batch.context's, the
    denominator: tests/test_seed_wiring.py checks the stage builds them so), one SGD step
    raises pi(token 1 | plain prompt), the probability used at test time; the hinted context's logits get no
    gradient. (Had the numerator used the hinted context, the plain probability would not move.)"""
    table = {6: torch.zeros(3, requires_grad=True), 8: torch.tensor([0.0, 2.0, 0.0], requires_grad=True)}

    def logp(prompt_ids, token):
        return torch.stack([torch.log_softmax(table[int(row[-1])], 0)[token] for row in prompt_ids]).unsqueeze(1)

    plain, hinted = T([[5, 6]]), T([[5, 6, 7, 8]])
    before = torch.softmax(table[6], 0)[1].item()
    old = logp(hinted, 1).detach()  # the sampler's context: the hinted prompt
    loss, _ = clipped_surrogate(logp(plain, 1), old, T([1.0]), torch.ones(1, 1), 0.2, 0.2)
    loss.sum().backward()
    assert table[8].grad is None or table[8].grad.abs().sum() == 0
    with torch.no_grad():
        table[6] -= 1.0 * table[6].grad
    assert torch.softmax(table[6], 0)[1].item() > before + 1e-3
