"""Answer readers (rlx/tasks/readers.py) on hand-written completions, their composition with a task's check
(rlx.tasks.grader), and the model preset choosing both the prompt and the reader (issue 49)."""

import pytest

from rlx.config.overrides import check_overrides
from rlx.tasks import READERS, VERIFIERS, get_verifier, grader, verifier_reward

MC = {"choices": ["red", "green", "blue", "black"]}  # a multiple-choice problem: letters A-D


@pytest.mark.parametrize("reader,text,problem,want", [
    ("tag", "so <answer>4</answer> then <answer> 5 </answer>", {}, "5"),          # the last tag, stripped
    ("tag", "The answer is 4.", {}, None),
    ("stated", "The answer is 10.", {}, "10"),                                      # SmolLM2's usual reply
    ("stated", "We get \\boxed{\\frac{1}{2}} here", {}, "\\frac{1}{2}"),
    ("stated", "<answer>7</answer> so the answer is 8", {}, "7"),                  # a tag wins
    ("stated", "2 + 8 = 10", {}, None),                                             # no statement
    ("boxed", "first \\boxed{3} then \\boxed{x^{2}}", {}, "x^{2}"),                # the last, braces balanced
    ("boxed", "The answer is 3", {}, None),
    ("last_number", "from 1,200 we take -3.5", {}, "-3.5"),
    ("last_number", "no digits", {}, None),
    ("final_number", "2 + 8 = 10", {}, "10"),                                       # stated, else the last number
    ("final_number", "What is 0 + 9 =", {}, None),                                  # an echoed question
    ("tag_or_last_number", "so #### 42 and 7", {}, "42"),
    ("tag_or_boxed", "\\boxed{9}", {}, "9"),
    ("letter", "Answer: B", MC, "B"),
    ("letter", "I think the answer is (C) because", MC, "C"),
    ("letter", "Between (A) and (D), (D) fits", MC, "D"),                           # the last in parentheses
    ("letter", "B. green is right", MC, "B"),                                       # a line opening with it
    ("letter", "  c  ", MC, None),                                                  # capitals only
    ("letter", "C", MC, "C"),
    ("letter", "The answer is E", MC, None),                                        # not among the four choices
    ("letter", "The answer is E", {}, "E"),                                         # no choices column: A-J
    ("letter", "<answer>A</answer> (B)", MC, "A"),
    ("letter", "I am not sure. Because it is red", MC, None),                      # a word's capital is no letter
    ("code", "    return x\ndef other():\n    pass", {"prompt": "def f(x):\n", "entry_point": "f"},
     "def f(x):\n    return x"),                                                    # cut at the next top-level def
])
def test_reader_on_hand_written_completions(reader, text, problem, want):
    assert READERS[reader](text, problem) == want


def test_the_readers_the_brief_names_are_registered():
    assert {"tag", "stated", "boxed", "last_number", "letter", "code"} <= set(READERS)


def test_grader_composes_a_models_reader_with_the_tasks_check():
    problems = [{"answer": "10"}] * 3
    completions = ["The answer is 10.", "<answer>10</answer>", "The answer is 11."]
    own = grader("numeric")  # the verifier's own reader: the tag, else '####', else the last number
    assert own is get_verifier("numeric") and own.reader == "tag_or_last_number"
    stated = grader("numeric", "stated")
    assert stated.reader == "stated" and stated.verify is get_verifier("numeric").verify  # the check stays the task's
    assert stated.score(completions, problems) == (["10", "10", "11"], [1.0, 1.0, 0.0])
    assert grader("exact").score(completions, problems)[1] == [0.0, 1.0, 0.0]  # tags only: the statements score 0
    assert grader("exact", "stated").score(completions, problems)[1] == [1.0, 1.0, 0.0]


def test_a_program_and_a_named_reading_keep_their_verifiers_own_reader_whatever_the_model_reads():
    assert grader("unit_tests", "stated") is get_verifier("unit_tests")
    assert get_verifier("unit_tests").reader == "code"
    assert grader("final_number", "tag").reader == "final_number"  # the old name keeps its promise


def test_the_training_reward_reads_with_the_same_reader():
    completions = ["The answer is 10.", "<answer>10</answer>", "10"]
    rows = {"answer": ["10"] * 3}
    assert verifier_reward(None, completions, "numeric", **rows) == [1.0, 1.0, 1.0]           # last number
    assert verifier_reward(None, completions, "numeric", reader="stated", **rows) == [1.0, 1.0, 0.0]
    assert verifier_reward(None, completions, "numeric", reader="tag", **rows) == [0.0, 1.0, 0.0]


def test_an_unknown_reader_is_one_line_with_the_choices():
    from rlx.errors import UserError

    with pytest.raises(UserError, match="unknown answer reader 'said'; valid choices: tag, "):
        grader("numeric", "said")


def test_every_registered_verifier_names_its_reader():
    for name, verifier in VERIFIERS.items():
        assert verifier.reader in READERS, name


@pytest.mark.parametrize("task", ["gcd", "basic_arithmetic", "leg_counting"])
def test_the_instruct_preset_asks_any_reasoning_gym_task_bare_and_reads_what_it_states(task):
    cfg = check_overrides(["model=smollm2-135m-instruct", "data=reasoning_gym", f"data.task={task}"])
    assert cfg.data.prompt_template == "{question}" and cfg.data.verifier == "reasoning_gym"
    assert cfg.reward.components.task.reader == "final_number"
    bench = check_overrides(["model=smollm2-135m-instruct", "benchmark=reasoning_gym",
                             f"benchmark.reasoning_gym.data.task={task}"], config_name="eval")
    assert (bench.benchmark.reasoning_gym.data.prompt_template == "{question}"
            and bench.model.answer.reader == "final_number")
    tiny = check_overrides(["data=reasoning_gym", f"data.task={task}"])  # the tiny model keeps the tags
    assert tiny.data.prompt_template.endswith("Give the final answer as <answer>...</answer>.")
    assert tiny.reward.components.task.reader is None


def test_the_answer_prompts_are_the_schemas_choices():
    from rlx.config import ANSWER_PROMPTS
    from rlx.config.groups import AnswerPrompt

    assert [p.value for p in AnswerPrompt] == list(ANSWER_PROMPTS)
    assert check_overrides(["model.answer.prompt=bare"]).data.prompt_template == "{question}"


def test_the_eval_table_says_which_reader_scored_each_benchmark():
    from rich.console import Console

    from rlx.evaluation.summary import render_table

    entry = {"greedy/accuracy": {"value": 0.5, "low": 0.25, "high": 0.75}}
    summary = {"benchmarks": {"chain_sum": {"model": entry, "reader": "final_number"},
                              "humaneval": {"model": entry, "reader": "code"}}}
    console = Console(record=True, width=160)
    console.print(render_table(summary, {"model": "m"}, 0.95))
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in console.export_text().splitlines() if line.count("│") > 3}
    assert rows == {"chain_sum": "final_number", "humaneval": "code"}


def test_a_benchmark_reads_as_its_own_reader_else_the_models_else_its_verifiers():
    from rlx.evaluation.benchmarks import Benchmark

    spec = {"load": {}, "verifier": "numeric", "max_new_tokens": 8}
    assert Benchmark("b", spec).reader == "tag_or_last_number"
    assert Benchmark("b", spec, "stated").reader == "stated"
    assert Benchmark("b", {**spec, "reader": "boxed"}, "stated").reader == "boxed"
    assert Benchmark("b", {**spec, "verifier": "unit_tests"}, "stated").reader == "code"
