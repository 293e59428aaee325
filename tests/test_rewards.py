import pytest

from rlx.errors import RewardError
from rlx.rewards import RewardComponent, compute_rewards
from rlx.rewards.rule import exact_match, extract_answer, format_reward, math_equivalence, task_score


def test_extract_answer_takes_last_block():
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("no tags") is None


def test_format_reward():
    assert format_reward(None,
                         ["<answer>3</answer>", " <answer>3</answer>\n", "3", "<answer></answer>",
                          "x<answer>3</answer>"]) == [
        1.0, 1.0, 0.0, 0.0, 0.0]


def test_exact_match_and_task_score():
    comps = ["<answer>-4</answer>", "<answer>4</answer>", "-4"]
    assert exact_match(None, comps, answer=["-4"] * 3) == [1.0, 0.0, 0.0]
    import json

    meta = json.dumps({"source_dataset": "chain_sum", "source_index": 0})
    scores = task_score(None, comps, answer=["-4"] * 3, task=["chain_sum"] * 3, metadata=[meta] * 3, question=["q"] * 3)
    assert scores == [1.0, 0.0, 0.0]


def test_math_equivalence():
    comps = ["<answer>\\frac{1}{2}</answer>", "<answer>0.5</answer>", "<answer>2</answer>", "none"]
    assert math_equivalence(None, comps, answer=["1/2"] * 4) == [1.0, 1.0, 0.0, 0.0]


def _boom(prompts, completions, **row):
    if any("bad" in c for c in completions):
        raise ValueError("cannot score")
    return [1.0 for _ in completions]


def test_compute_rewards_weights_none_and_errors():
    comps = [
        RewardComponent("one", lambda prompts, completions, **r: [1.0, None], 2.0),
        RewardComponent("half", lambda prompts, completions, **r: [0.5, 0.5], 1.0),
    ]
    total, per, errors = compute_rewards(comps, ["p", "q"], ["a", "b"], [{"answer": "1"}, {"answer": "2"}])
    assert total.tolist() == [2.5, 0.5]  # None counts 0 in the total
    assert per["one"][1].isnan()
    assert errors == 0
    failing = [RewardComponent("boom", _boom, 1.0)]
    with pytest.raises(RewardError, match="'bad completion'"):
        compute_rewards(failing, ["p", "q"], ["good", "bad completion"], [{}, {}])
    total, _, errors = compute_rewards(failing, ["p", "q"], ["good", "bad completion"], [{}, {}], on_error="zero")
    assert total.tolist() == [1.0, 0.0] and errors == 1
