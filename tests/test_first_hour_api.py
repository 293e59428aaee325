"""Issue 32, the first hour of a new user coming from TRL: `rlx.fit(..., dataset=rows)` (a list of dicts or a
datasets.Dataset, with an eval split), an answer column only where something reads one, `prompts=` as TRL passes
it, `trainer_state` with the evaluated step, `data=file` saying what its prompt template adds, `rlx eval run=`
scoring the run's own held-out data like its eval/accuracy, and a benchmark file outside the package."""

from __future__ import annotations

import json

import pytest

import rlx
from rlx.errors import UserError
from tests.conftest import run_rlx

FAST = ["steps=2", "prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8",
        "log.samples_every=0", "save.plot=false", "hardware.num_threads=1"]
CALLS: list[dict] = []


def even_length(prompts, completions, target, trainer_state, **kwargs):
    """A TRL-style reward reading its own column (`target`); 1.0 for a completion of even length (greedy
    completions differ in length, so held-out scores are not all equal). Records what it was given."""
    CALLS.append({"prompts": list(prompts), "n": len(completions), "step": trainer_state.global_step,
                  "max_steps": trainer_state.max_steps, "columns": sorted(kwargs)})
    return [float(len(c) % 2 == 0) for c in completions]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLX_OUTPUTS", str(tmp_path / "outputs"))
    CALLS.clear()
    return tmp_path


def test_fit_takes_a_list_of_dicts_and_evaluate_scores_the_same_rows(in_tmp):
    """30 rows without an answer column, reward functions given: trained as they are (no prompt template), 1 row
    in 10 held out; the reward sees each row's prompt as `prompts` (TRL), its own `target` column, and in the
    held-out evaluations (3 completions) trainer_state.global_step 0 and then 2 (the real steps, of max_steps 2).
    `rlx.evaluate(run=...)` then scores the same 3 held-out rows with the same reward: the same greedy accuracy."""
    rows = [{"prompt": f"Say {i}", "target": str(i)} for i in range(30)]
    run = rlx.fit([*FAST, "eval.every=2"], rewards=[even_length], dataset=rows)
    written = (run.run_dir / "dataset" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in written] == rows
    from omegaconf import OmegaConf

    config = OmegaConf.load(run.run_dir / "config.yaml")
    assert config.data.columns.answer is None and config.data.prompt_template is None and config.data.eval_size == 3
    prompts = {p for call in CALLS for p in call["prompts"]}
    assert prompts <= {row["prompt"] for row in rows}  # the prompt column itself: no template, no chat markup
    assert all("prompt_texts" not in call["columns"] for call in CALLS)  # only for a function that names it
    evaluations = [call for call in CALLS if call["n"] == 3]
    assert [(c["step"], c["max_steps"]) for c in evaluations] == [(0, 2), (2, 2)]
    report = rlx.evaluate([f"run={run.run_dir}", "sampling.n=0", "plot=false", "hardware.num_threads=1"])
    (name,) = report.metrics["benchmarks"]
    result = report.metrics["benchmarks"][name]
    assert name == "dataset" and result["problems"]["model"] == 3
    assert result["model"]["greedy/accuracy"]["value"] == pytest.approx(run.metrics["eval/accuracy"])


def test_fit_takes_a_datasets_dict_with_its_test_split(in_tmp):
    from datasets import Dataset, DatasetDict

    train = [{"prompt": f"Say {i}", "target": str(i)} for i in range(12)]
    test = [{"prompt": f"Tell {i}", "target": str(i)} for i in range(4)]
    run = rlx.fit([*FAST[:1], "steps=1", *FAST[1:]], rewards=[even_length],
                  dataset=DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)}))
    held_out = [json.loads(line) for line in (run.run_dir / "dataset" / "eval.jsonl").read_text().splitlines()]
    assert held_out == test
    assert {p for call in CALLS if call["n"] == 4 and call["step"] == 0 for p in call["prompts"]} == \
        {row["prompt"] for row in test}  # the held-out evaluation runs on the test split


def test_an_answer_is_needed_only_where_something_reads_one(in_tmp):
    """Without rewards= the default reward (the task verifier) reads `answer`: one line naming the fix, and no
    run directory left behind."""
    rows = [{"prompt": f"Say {i}", "target": str(i)} for i in range(20)]
    with pytest.raises(UserError, match=r"reward component\(s\) task read the answer column and the data has none"):
        rlx.fit(FAST, dataset=rows)
    assert not list((in_tmp / "outputs" / "train").glob("*"))
    import logging

    # the deleted run's train.log handler is gone with it: the process's next warning is not a FileNotFoundError
    assert not [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)
                and str(in_tmp) in h.baseFilename]
    logging.getLogger("rlx").warning("a later warning in the same process")
    with pytest.raises(UserError, match="either as dataset= or as data="):
        rlx.fit(["data=gsm8k"], rewards=[even_length], dataset=rows)


def test_prompts_reach_rewards_as_trl_passes_them():
    """compute_rewards: `prompts` is each row's prompt column (TRL), not the rendered model input; a function
    naming `prompt_texts` gets the rendered one, and no other function gets it."""
    from rlx.rewards import RewardComponent, compute_rewards

    seen = {}

    def plain(prompts, completions, answer, **kwargs):
        seen["plain"] = prompts
        seen["plain kwargs"] = sorted(kwargs)
        return [1.0] * len(completions)

    def rendered(prompts, completions, prompt_texts, **kwargs):
        seen["rendered"] = prompt_texts
        return [1.0] * len(completions)

    rows = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "What is 3+3?", "answer": "6"}]
    texts = ["<|user|>What is 2+2?<|assistant|>", "<|user|>What is 3+3?<|assistant|>"]
    compute_rewards([RewardComponent("plain", plain, 1.0), RewardComponent("rendered", rendered, 1.0)], texts,
                    ["4", "6"], rows)
    assert seen == {"plain": ["What is 2+2?", "What is 3+3?"], "rendered": texts,
                    "plain kwargs": ["completion_ids", "trainer_state"]}


def _file(tmp_path, name: str, count: int) -> None:
    rows = [{"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(count)]
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_data_file_says_what_its_template_adds_and_eval_run_scores_its_rows(tmp_path):
    """`rlx train data=file ...` logs the text data.prompt_template appends and how to turn it off; `rlx eval
    run=<that run>` evaluates the file's held-out rows (not chain_sum) with the data's verifier, matching the
    run's own final eval/accuracy."""
    _file(tmp_path, "sums.jsonl", 24)
    result = run_rlx(["train", "data=file", "data.train_path=sums.jsonl", "data.eval_size=4", *FAST], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert ("data.prompt_template appends '\\nGive the final answer as <answer>...</answer>.' to every prompt of "
            "sums.jsonl") in output and "data.prompt_template=null keeps the prompts as they are" in output
    (run,) = (tmp_path / "outputs" / "train").iterdir()
    evaluated = run_rlx(["eval", f"run={run}", "sampling.n=0", "plot=false", "hardware.num_threads=1"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (summary,) = (tmp_path / "outputs" / "eval").glob("*/summary.json")
    benchmarks = json.loads(summary.read_text())["benchmarks"]
    assert list(benchmarks) == ["sums"] and benchmarks["sums"]["problems"]["model"] == 4
    final = json.loads((run / "result.json").read_text())["metrics"]["eval/accuracy"]
    assert benchmarks["sums"]["model"]["greedy/accuracy"]["value"] == pytest.approx(final)


def test_say_template_is_silent_when_the_prompts_stay_as_they_are():
    from rlx.data.tasks import say_template

    rows = [{"question": "q"}]
    assert say_template(None, rows, "x.jsonl") is None and say_template("{question}", rows, "x.jsonl") is None
    assert say_template("Q: {question}", rows,
                        "x.jsonl").startswith("data.prompt_template puts every prompt of x.jsonl")


def test_a_benchmark_file_outside_the_package(tmp_path):
    """`rlx eval benchmark=capitals.yaml` (the README's worked example, without copying it into the package),
    alone or beside a package benchmark; a missing file is one line."""
    capitals = [("France", "Paris"), ("Spain", "Madrid"), ("Italy", "Rome"), ("Peru", "Lima")]
    (tmp_path / "capitals.jsonl").write_text("".join(json.dumps({"question": f"Capital of {c}?", "answer": a}) + "\n"
                                                     for c, a in capitals))
    (tmp_path / "capitals.yaml").write_text(
        "capitals:\n  load:\n    _target_: rlx.evaluation.benchmarks.qa_problems\n    name: capitals\n"
        "    path: capitals.jsonl\n    question_column: question\n    answer_column: answer\n"
        "    prompt_template: \"{question}\\nGive the final answer as <answer>...</answer>.\"\n"
        "  verifier: exact\n  max_new_tokens: 16\n")
    common = ["sampling.n=0", "plot=false", "hardware.num_threads=1"]
    result = run_rlx(["eval", "benchmark=[chain_sum,capitals.yaml]", "limit=3", *common], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = (tmp_path / "outputs" / "eval").glob("*/summary.json")
    problems = {name: b["problems"]["model"] for name, b in json.loads(summary.read_text())["benchmarks"].items()}
    assert problems == {"chain_sum": 3, "capitals": 3}
    missing = run_rlx(["eval", "benchmark=nope.yaml", *common], tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip() == \
        "error: benchmark file 'nope.yaml' not found (run from the folder it is in, or give its path)"


def test_eval_explains_mean_at_1_beside_pass_at_1():
    from rlx.evaluation.explain import metric_notes

    summary = {"sampling": {"n": 8},
               "benchmarks": {"b": {"model": {"pass@1": {}, "mean@1": {}, "greedy/accuracy": {}}}}}
    notes = metric_notes(summary)
    assert "mean@1 reads one sample" in notes[0] and "all n=8 samples" in notes[0] and "greedy" in notes[1]
    assert metric_notes({"benchmarks": {"b": {"model": {"pass@1": {}}}}}) == []


def test_eval_run_whose_reward_lives_in_another_process(tmp_path, caplog):
    """A run scored by a reward function that does not import here (a callable of another Python process): with answers
    in its data, its verifier scores instead, with a warning; without answers, one line asks for a benchmark."""
    import logging

    from omegaconf import OmegaConf

    from rlx.evaluation.run_task import run_task_benchmark

    config = {"seed": 0, "eval": {"max_new_tokens": 8}, "model": {"chat_template": True},
              "data": {"name": "file", "source": "file", "train_path": str(tmp_path / "sums.jsonl"), "eval_path": None,
                       "eval_size": 2, "columns": {"prompt": "prompt", "answer": "answer"}, "seed": 0,
                       "prompt_template": None, "verifier": None, "system_prompt": None},
              "reward": {"components": {"gone": {"_target_": "rlx.api.registered.gone", "weight": 1.0}},
                         "accuracy": "gone"}}
    OmegaConf.save(OmegaConf.create(config), tmp_path / "config.yaml")
    with caplog.at_level(logging.WARNING, logger="rlx"):
        name, spec = run_task_benchmark(str(tmp_path))
    assert (name, spec["verifier"], spec["verify"]) == ("sums", "exact", None)
    assert "cannot be imported here: scoring with the data's verifier instead" in caplog.text
    config["data"]["columns"]["answer"] = None
    OmegaConf.save(OmegaConf.create(config), tmp_path / "config.yaml")
    with pytest.raises(UserError, match="its data has no answer column for a verifier; name a benchmark"):
        run_task_benchmark(str(tmp_path))
