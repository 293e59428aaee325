"""TRL's reward-function contract: called by keyword with every column under its own name, None for
"not applicable", conversational prompts and completions; bad outputs become RewardError naming the
component and a completion. The reward functions below are written after the examples in TRL's GRPO
trainer documentation ("Using a custom reward function") and run unchanged."""

import json
import math
import re

import numpy as np
import pytest
import torch

from rlx.errors import RewardError
from rlx.rewards import RewardComponent, TrainerState, compute_rewards
from rlx.rewards.rule import exact_match, format_reward
from rlx.rollout.prompts import format_prompts
from tests.conftest import only_run_dir, run_rlx


# --- reward functions as TRL's documentation writes them -------------------------------------------
def length_reward(completions, **kwargs):
    """Reward longer completions (TRL docs: standard format)."""
    return [float(len(completion)) for completion in completions]


def boxed_reward(completions, ground_truth, **kwargs):
    """Reward a \\boxed{} answer equal to the dataset's ground_truth column (TRL docs)."""
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def format_reward_func(completions, **kwargs):
    """Conversational format: each completion is [{"role": "assistant", "content": ...}] (TRL docs)."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def math_reward_func(prompts, completions, task, **kwargs):
    """Multi-task: None where the reward does not apply (TRL docs)."""
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):  # noqa: B007 (as the docs write it)
        if t == "math":
            rewards.append(1.0 if "4" in completion else -1.0)
        else:
            rewards.append(None)
    return rewards


def state_reward(completions, completion_ids, trainer_state, **kwargs):
    """Uses the token ids and the step, as TRL passes them."""
    return [len(ids) + trainer_state.global_step / 10 for ids in completion_ids]


# ------------------------------------------------------------------------------------------------------
def test_trl_documented_reward_functions_run_unchanged():
    completions = ["so \\boxed{4}", "\\boxed{5} is long", "no box"]
    rows = [{"prompt": "2+2?", "ground_truth": "4", "task": "math"},
            {"prompt": "2+3?", "ground_truth": "4", "task": "math"},
            {"prompt": "hi", "ground_truth": "x", "task": "chat"}]
    components = [RewardComponent("length", length_reward, 0.0), RewardComponent("boxed", boxed_reward, 1.0),
                  RewardComponent("math", math_reward_func, 1.0), RewardComponent("state", state_reward, 0.0)]
    total, per, errors = compute_rewards(components, ["p1", "p2", "p3"], completions, rows,
                                         completion_ids=[[1, 2], [3], []],
                                         state=TrainerState(global_step=7, max_steps=9))
    assert per["length"].tolist() == [12.0, 17.0, 6.0]
    assert per["boxed"].tolist() == [1.0, 0.0, 0.0]  # the ground_truth column arrived under its own name
    assert per["math"][:2].tolist() == [1.0, -1.0] and math.isnan(per["math"][2])  # None: not applicable
    assert per["state"].tolist() == pytest.approx([2.7, 1.7, 0.7])
    assert total.tolist() == [2.0, -1.0, 0.0] and errors == 0  # None counts 0 in the total


def test_conversational_rows_give_message_lists_to_rewards_and_chat_templates():
    rows = [{"prompt": [{"role": "system", "content": "Think first."}, {"role": "user", "content": "2+2?"}],
             "answer": "4"},
            {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6"}]
    completions = ["<think>easy</think><answer>4</answer>", "<answer>5</answer>"]
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen["prompts"] = prompts
        return [0.0] * len(completions)

    components = [RewardComponent("format", format_reward_func, 1.0), RewardComponent("exact", exact_match, 1.0),
                  RewardComponent("tags", format_reward, 1.0), RewardComponent("spy", spy, 0.0)]
    _, per, _ = compute_rewards(components, ["rendered 1", "rendered 2"], completions, rows, system_prompt="Be brief.")
    assert per["format"].tolist() == [1.0, 0.0]
    assert per["exact"].tolist() == [1.0, 0.0]  # rlx's own rewards read message completions too
    assert per["tags"].tolist() == [0.0, 1.0]
    assert seen["prompts"][0][0] == {"role": "system", "content": "Think first."}  # the row's own system prompt kept
    assert seen["prompts"][1][0] == {"role": "system", "content": "Be brief."}  # data.system_prompt added
    from rlx.models.loading import load_tokenizer

    tokenizer = load_tokenizer("builtin:tiny", None, False)
    texts = format_prompts(tokenizer, rows, True, "Be brief.")
    assert "Think first." in texts[0] and "Be brief." not in texts[0] and "2+2?" in texts[0]
    assert "Be brief." in texts[1] and "3+3?" in texts[1]


@pytest.mark.parametrize("output, needle", [
    (["1.0", 0.0], "returned str '1.0' for completion 'first answer'"),
    ([float("nan"), 0.0], "returned nan for completion 'first answer'"),
    ([0.0, float("inf")], "returned inf for completion 'second answer'"),
    ([0.0, 1e300], "returned 1e+300 for completion 'second answer', beyond float32"),  # finite, inf once float32
    ([1.0], "returned 1 scores for 2 completions"),
    (3.0, "returned float, not a list"),
    ([{"score": 1}, 0.0], "returned dict"),
])
def test_bad_reward_outputs_raise_reward_error_naming_component_and_completion(output, needle):
    component = RewardComponent("mine", lambda completions, **kw: output, 1.0)
    for on_error in ("raise", "zero"):
        with pytest.raises(RewardError, match="reward 'mine'") as info:
            compute_rewards([component], ["p", "q"], ["first answer", "second answer"], [{}, {}], on_error=on_error)
        assert needle in str(info.value)


def test_a_weighted_total_beyond_float32_is_a_reward_error():
    # each score fits float32, their weighted sum does not: it would tie every group at inf (zero advantage)
    components = [RewardComponent("big", lambda completions, **kw: [3e38, 1.0], 1.0),
                  RewardComponent("bigger", lambda completions, **kw: [3e38, 1.0], 1.0)]
    with pytest.raises(RewardError, match="weighted reward total overflows float32"):
        compute_rewards(components, ["p", "q"], ["a", "b"], [{}, {}])


def test_none_for_every_completion_from_every_component_is_said_once(caplog, monkeypatch):
    import rlx.rewards

    monkeypatch.setattr(rlx.rewards, "_NOTHING_SCORED_WARNED", [])
    components = [RewardComponent("math", lambda completions, **kw: [None] * len(completions), 1.0),
                  RewardComponent("code", lambda completions, **kw: [None] * len(completions), 1.0)]
    with caplog.at_level("WARNING", logger="rlx"):
        for _ in range(2):
            total, _, _ = compute_rewards(components, ["p", "q"], ["a", "b"], [{}, {}])
        compute_rewards(components[:1] + [RewardComponent("one", lambda completions, **kw: [1.0, None], 1.0)],
                        ["p", "q"], ["a", "b"], [{}, {}])
    assert total.tolist() == [0.0, 0.0]
    said = [r.getMessage() for r in caplog.records if "returned None" in r.getMessage()]
    assert len(said) == 1 and "(math, code)" in said[0] and "all 2 completions" in said[0]


def test_numpy_and_tensor_scores_are_accepted():
    components = [RewardComponent("np", lambda completions, **kw: np.array([1.0, 0.5]), 1.0),
                  RewardComponent("torch", lambda completions, **kw: torch.tensor([0.0, 1.0]), 1.0),
                  RewardComponent("np_scalars", lambda completions, **kw: [np.float32(2.0), None], 1.0)]
    total, _, _ = compute_rewards(components, ["p", "q"], ["a", "b"], [{}, {}])
    assert total.tolist() == [3.0, 1.5]


def test_trl_reward_reads_the_datasets_own_answer_column_in_a_training_run(tmp_path):
    """A TRL-style accuracy(completions, solution, **kwargs) on a file dataset whose answer column is
    `solution`: the column reaches the function under its own name (reward mean 1.0 by construction)."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{a} + {b} =", "solution": str(a + b)}) + "\n"
                            for a in range(6) for b in range(6)))
    result = run_rlx(["train", "data=file", f"data.train_path={data}", "data.eval_size=4",
                      "data.columns.prompt=problem", "data.columns.answer=solution", "reward.components={}",
                      "+reward.components.sol._target_=tests.helpers.solution_is_a_number",
                      "+reward.components.sol.weight=1.0", "reward.accuracy=sol", "steps=1", "prompts_per_step=2",
                      "rollout.samples_per_prompt=2", "eval.size=4", "rollout.max_new_tokens=8", "save.final=false",
                      "save.plot=false", "hardware.num_threads=1"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (only_run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["eval/accuracy"] == 1.0 and rows[1]["reward/sol"] == 1.0


def test_max_prompt_length_drops_or_truncates_and_counts():
    from rlx.models.loading import load_tokenizer
    from rlx.rollout.prompt_limits import limit_prompt_length

    tokenizer = load_tokenizer("builtin:tiny", None, False)
    short = {"prompt": "1 + 2 =", "answer": "3"}
    long = {"prompt": "9 + 9 + 9 + 9 + 9 + 9 + 9 + 9 + 9 + 9 + 9 + 9 = what? 1 + 2 =", "answer": "3"}
    chat = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": long["prompt"]}],
            "answer": "3"}

    def length(row):
        return len(tokenizer(format_prompts(tokenizer, [row], True, None)[0], add_special_tokens=False)["input_ids"])

    limit = length(short) + 4
    assert length(long) > limit and length(chat) > limit
    kept, counts = limit_prompt_length(tokenizer, [short, long, chat], limit, "drop", True, None)
    assert kept == [short] and counts == {"prompts": 3, "over_length": 2, "dropped": 2, "truncated": 0}
    kept, counts = limit_prompt_length(tokenizer, [short, long, chat], length(long) - 3, "truncate", True, None)
    assert counts["over_length"] == 2 and counts["truncated"] + counts["dropped"] == 2 and counts["truncated"] >= 1
    for row in kept:
        assert length(row) <= length(long) - 3
        text = row["prompt"][-1]["content"] if isinstance(row["prompt"], list) else row["prompt"]
        assert text.endswith("1 + 2 =")  # the end of the user message is kept
    assert limit_prompt_length(tokenizer, [short, long], None, "drop", True, None)[0] == [short, long]


def test_chat_list_dataset_trains_with_max_prompt_length(tmp_path):
    data = tmp_path / "chat.jsonl"
    lines = []
    for a in range(5):
        for b in range(5):
            filler = " and then" * (12 if (a + b) % 3 == 0 else 0)
            messages = [{"role": "system", "content": "Answer in tags."},
                        {"role": "user", "content": f"What is{filler} {a} + {b}?"}]
            lines.append(json.dumps({"prompt": messages, "answer": str(a + b)}))
    data.write_text("\n".join(lines) + "\n")
    result = run_rlx(["train", "data=file", f"data.train_path={data}", "data.eval_size=4", "data.max_prompt_length=40",
                      "steps=1", "prompts_per_step=2", "rollout.samples_per_prompt=2", "eval.size=4",
                      "rollout.max_new_tokens=8", "save.final=false", "save.plot=false", "hardware.num_threads=1"],
                     tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    counts = json.loads((run / "prompt_length.json").read_text())
    assert counts["dropped"] > 0 and counts["prompts"] == 21 and counts["max_prompt_length"] == 40
    sample = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/total" in sample
