"""A real instruct model gets a reward signal at its preset's defaults: the answer is read where an instruct model
states it (model.answer.reader: rlx.tasks.final_number), the format bonus is logged apart from correctness, and a model
preset's tuning files (conf/tuning/) reach the other groups without touching the tiny model's defaults."""

import pytest

from rlx.config.overrides import check_overrides
from rlx.config.paths import CONF_DIR, group_options
from rlx.rewards.rule import format_reward, stated_answer_format
from rlx.tasks import final_number, get_verifier, stated_answer


@pytest.mark.parametrize("text,stated,final", [
    ("The answer is 10.", "10", "10"),                                     # SmolLM2's usual reply
    ("The final answer to this arithmetic problem is -3.", "-3", "-3"),  # words between "answer" and "is"
    ("2 + 8 = 10", None, "10"),                                           # no statement: the last number
    ("<answer>4</answer> and then 5", "4", "4"),                          # a tag wins over later numbers
    ("so \\boxed{7}, not 8", "7", "7"),
    ("Answer: 1,234.5 in all", "1,234.5", "1,234.5"),
    ("The answer is 3, not 4.", "3", "3"),                                # the stated number, not the last one
    ("The final answer is 1 + 7 = 8.", None, "8"),                        # an expression: its result, the last number
    ("The answer is 12. Check: 12 - 3 = 9", "12", "12"),
    ("no digits here", None, None),
    ("What is 0 + 9 =", None, None),                                      # an echoed question: no answer
    ("0 + 9 = ?", None, None),
    ("So we add 9 + 0", None, None),                                      # an operand, not a result
    ("Let's compute 8 -3", None, None),                                   # a binary minus before the last number
    ("It is -3", None, "-3"),                                             # a negative number is an answer
    ("9 + 0 = 9", None, "9"),                                             # the expression's result
])
def test_stated_and_final_answers(text, stated, final):
    assert stated_answer(text) == stated
    assert final_number(text, {}) == final


def test_final_number_verifier_matches_numbers():
    verifier = get_verifier("final_number")
    completions = ["The answer is 10.", "The answer is 1,000.", "2 + 8 = 11", "The answer is ten.", "10 + 0 ="]
    problems = [{"answer": "10"}, {"answer": "1000"}, {"answer": "10"}, {"answer": "10"}, {"answer": "10"}]
    extracted, scores = verifier.score(completions, problems)
    assert extracted == ["10", "1,000", "11", None, None]
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0]  # an echoed "10 + 0 =" ends in the sum but answers nothing


def test_format_bonus_is_for_a_stated_answer_and_separate_from_correctness():
    completions = ["The answer is 11.", "2 + 8 = 10", "<answer>10</answer>"]
    assert stated_answer_format(None, completions) == [1.0, 0.0, 1.0]  # a wrong answer stated outright still counts
    assert format_reward(None, completions) == [0.0, 0.0, 1.0]          # the tag format the tiny model is trained for


def test_preset_tuning_reaches_the_other_groups():
    cfg = check_overrides(["model=smollm2-135m-instruct"])
    assert cfg.model.path == "package:smollm2-135m-instruct"
    assert cfg.optim.lr == cfg.model.lr == 1e-5
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.max_new_tokens == 32
    assert cfg.data.verifier == "reasoning_gym" and cfg.data.prompt_template == "{question}"  # the task's check
    assert cfg.model.answer.reader == cfg.reward.components.task.reader == "final_number"  # read as it writes
    assert cfg.data.task_config.max_terms == 2
    assert cfg.reward.components.format._target_ == "rlx.rewards.rule.stated_answer_format"
    assert cfg.reward.accuracy == "task"  # correctness is the verifier's component alone


def test_tiny_defaults_are_untouched_and_overrides_win():
    tiny = check_overrides([])
    assert tiny.model.path == "builtin:tiny" and tiny.rollout.temperature == 1.0
    assert tiny.data.verifier == "reasoning_gym" and tiny.data.task_config.max_terms == 3
    cfg = check_overrides(["model=smollm2-135m-instruct", "rollout.temperature=0.3", "data.task_config.max_terms=3"])
    assert cfg.rollout.temperature == 0.3 and cfg.data.task_config.max_terms == 3
    other = check_overrides(["model=smollm2-135m-instruct", "data=gsm8k"])  # no per-task file: the data's own
    assert other.data.name == "gsm8k" and other.rollout.temperature == 0.7


def test_a_recipe_that_overrides_the_model_gets_its_tuning():
    cfg = check_overrides(["recipes=smollm2_grpo_chain_sum"])
    assert cfg.model.path == "package:smollm2-135m-instruct" and cfg.reward.components.task.reader == "final_number"


def test_every_tuning_file_names_a_model_preset_and_a_data_option():
    # <model>.yaml, <model>/<data>.yaml, <model>/benchmark_<benchmark>.yaml (rlx eval), env/<model>/<env>.yaml
    models, data = set(group_options("model")), set(group_options("data"))
    benchmarks, envs = set(group_options("benchmark")), set(group_options("env"))
    for path in (CONF_DIR / "tuning").rglob("*.yaml"):
        parts = path.relative_to(CONF_DIR / "tuning").with_suffix("").parts
        model, rest, options = (parts[1], parts[2:], envs) if parts[0] == "env" else (parts[0], parts[1:], data)
        assert model in models, f"{path}: no model preset {model}"
        if rest and rest[0].startswith("benchmark_") and parts[0] != "env":
            rest, options = (rest[0][len("benchmark_"):],), benchmarks
        assert len(rest) <= 1 and (not rest or rest[0] in options), f"{path}: no option {rest} of its group"
        assert path.read_text().lstrip().startswith("# @package _global_")
